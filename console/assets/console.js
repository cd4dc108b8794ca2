// Live refresh of the parts marked data-refresh="SECONDS": the page is
// fetched again and the part replaced. The console works without it.
(function () {
  document.querySelectorAll("[data-refresh]").forEach(function (el, i) {
    var secs = parseInt(el.getAttribute("data-refresh"), 10) || 5;
    setInterval(function () {
      fetch(location.href, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (!html) return;
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.querySelectorAll("[data-refresh]")[i];
          if (fresh) el.replaceWith(fresh), el = fresh;
        })
        .catch(function () {});
    }, secs * 1000);
  });
})();
