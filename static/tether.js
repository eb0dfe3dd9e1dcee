// The Tether page: countdowns to each reaching's deadline, the queue order of the reachings, and
// a CSRF token for forms added by live fragments (rendered without a request, they carry none).
(function () {
  "use strict";
  function tick() {
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.deadline) - Date.now()) / 1000);
      var a = Math.abs(left), h = Math.floor(a / 3600), m = Math.floor(a % 3600 / 60), s = a % 60;
      var text = (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
      el.textContent = left >= 0 ? text + " left" : "overdue " + text;
      el.classList.toggle("overdue", left < 0);
    });
  }
  // The CSS order keeps live-appended cards in queue order. Set through the CSSOM: the
  // Content-Security-Policy refuses style="" attributes in the markup.
  function order() {
    document.querySelectorAll("[data-order]").forEach(function (el) {
      el.style.order = el.dataset.order;
    });
  }
  tick();
  order();
  setInterval(tick, 1000);
  document.addEventListener("annihilation:event", order);
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (form.method.toLowerCase() !== "post" || form.querySelector("[name=csrfmiddlewaretoken]")) return;
    var token = document.querySelector("[name=csrfmiddlewaretoken]");
    if (token) form.append(token.cloneNode());
  }, true);
})();
