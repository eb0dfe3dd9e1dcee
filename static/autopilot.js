// The autopilot's card and goal pages: forms redrawn by live fragments are rendered without a
// request and carry no CSRF token; a post from one takes the page's own token.
(function () {
  "use strict";
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (form.method.toLowerCase() !== "post" || form.querySelector("[name=csrfmiddlewaretoken]")) return;
    var token = document.querySelector("[name=csrfmiddlewaretoken]");
    if (token) form.append(token.cloneNode());
  }, true);
})();
