// Any error of a later script, and any load the content security policy blocks, is
// written into the page (and onto <html data-page-error>) so it cannot pass unseen.
(function () {
  "use strict";
  function record(message) {
    var root = document.documentElement;
    var before = root.getAttribute("data-page-error");
    root.setAttribute("data-page-error", before ? before + "; " + message : message);
    var box = document.getElementById("page-errors");
    if (box) {
      box.hidden = false;
      box.textContent += "Page error: " + message + "\n";
    }
  }
  window.addEventListener("error", function (event) {
    if (event.message) {
      record(event.message + " (line " + event.lineno + ")");
    } else if (event.target && event.target !== window) {
      record("could not load " + (event.target.src || event.target.href || event.target.tagName));
    }
  }, true);
  document.addEventListener("securitypolicyviolation", function (event) {
    record("blocked by the page's policy: " + event.violatedDirective + " " + event.blockedURI);
  });
})();
