// Flame graphs: hover describes a frame, click zooms to it (the bottom bar resets). Then
// <html data-report-ready> marks that the script ran to its end.
(function () {
  "use strict";
  var WIDTH = 1200;
  var CHAR_WIDTH = 6.7; // the same estimate the report's writer cuts labels with

  function fit(name, width) {
    var fits = Math.floor((width - 6) / CHAR_WIDTH);
    var chars = Array.from(name);
    if (fits < 3) return "";
    if (chars.length <= fits) return name;
    return chars.slice(0, fits - 1).join("") + "\u2026";
  }

  function num(g, key) {
    return parseFloat(g.getAttribute(key));
  }

  function zoom(svg, target) {
    var x0 = num(target, "data-x"), w0 = num(target, "data-w"), d0 = num(target, "data-d");
    var eps = 1e-9;
    svg.querySelectorAll("g.f").forEach(function (g) {
      var x = num(g, "data-x"), w = num(g, "data-w"), d = num(g, "data-d");
      var nx = 0, nw = 1, shown = true, below = false;
      if (d < d0) {
        // Only the target's callers span its whole range at a lower depth.
        shown = x <= x0 + eps && x + w >= x0 + w0 - eps;
        below = true;
      } else if (x >= x0 - eps && x + w <= x0 + w0 + eps) {
        nx = (x - x0) / w0;
        nw = w / w0;
      } else {
        shown = false;
      }
      g.style.display = shown ? "" : "none";
      if (!shown) return;
      g.classList.toggle("caller", below);
      var rect = g.querySelector("rect"), text = g.querySelector("text");
      rect.setAttribute("x", (nx * WIDTH).toFixed(2));
      rect.setAttribute("width", (nw * WIDTH).toFixed(2));
      text.setAttribute("x", (nx * WIDTH + 3).toFixed(2));
      text.textContent = fit(g.getAttribute("data-n"), nw * WIDTH);
    });
  }

  var graphs = document.querySelectorAll("svg.flame");
  graphs.forEach(function (svg) {
    var details = svg.closest("figure").querySelector(".flame-details");
    svg.addEventListener("mouseover", function (event) {
      var g = event.target.closest("g.f");
      if (g) details.textContent = g.querySelector("title").textContent;
    });
    svg.addEventListener("click", function (event) {
      var g = event.target.closest("g.f");
      if (g) zoom(svg, g);
    });
  });

  var root = document.documentElement;
  root.setAttribute("data-flame-graphs", String(graphs.length));
  root.setAttribute("data-report-ready", "1");
})();
