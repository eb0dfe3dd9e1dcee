// Live pages: subscribe to the topics <body> names, apply server-rendered fragments, and on
// reconnect catch up from the last event id seen (the server replays what was missed).
(function () {
  "use strict";
  var body = document.body;
  var topics = JSON.parse(body.dataset.topics || "[]");
  if (!topics.length) return;
  var last = parseInt(body.dataset.after || "0", 10);
  var params = JSON.parse(body.dataset.params || "{}");
  var delay = 500;
  var badge = document.getElementById("live-status");
  function status(text) { if (badge) { badge.textContent = text; badge.dataset.state = text; } }

  function apply(html) {
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    Array.prototype.slice.call(tpl.content.children).forEach(function (el) {
      var swap = (el.dataset.swap || "replace").split(":");
      var existing = el.id ? document.getElementById(el.id) : null;
      if (existing) { existing.replaceWith(el); return; }  // replace, or a replayed append
      if (swap[0] === "replace") return;
      var container = document.getElementById(swap[1]);
      if (!container) return;
      if (swap[0] === "append") container.append(el); else container.prepend(el);
      var limit = parseInt(container.dataset.limit || "0", 10);
      while (limit && container.children.length > limit) {
        (swap[0] === "append" ? container.firstElementChild : container.lastElementChild).remove();
      }
    });
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + location.host + "/ws/events/");
    ws.onopen = function () {
      delay = 500;
      status("live");
      ws.send(JSON.stringify({subscribe: topics, after: last, page: body.dataset.page, params: params}));
    };
    ws.onmessage = function (msg) {
      var data = JSON.parse(msg.data);
      if (data.event && data.event.id > last) last = data.event.id;
      if (data.html) apply(data.html);
      document.dispatchEvent(new CustomEvent("annihilation:event", {detail: data}));
    };
    ws.onclose = function () {
      status("reconnecting");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 5000);
    };
  }
  connect();
})();
