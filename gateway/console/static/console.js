// infergate console: refresh the live parts of a page. Every element with an id and a
// data-refresh-ms attribute is fetched again (the same page, same address) that often
// and swapped for its new copy; it stops when the new copy has no such attribute (a job
// that finished). An element holding the keyboard focus waits, so a refresh never
// takes a button from under a user. Everything works without this file: it only saves
// reloading the page.
"use strict";
(function () {
  function schedule(el) {
    var every = parseInt(el.getAttribute("data-refresh-ms"), 10);
    if (!(every > 0)) { return; }
    window.setTimeout(function () { refresh(el.id); }, every);
  }
  function refresh(id) {
    var current = document.getElementById(id);
    if (!current) { return; }
    if (current.contains(document.activeElement) && document.activeElement !== document.body) {
      schedule(current);
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (answer) {
        if (answer.redirected || !answer.ok) { throw new Error("status " + answer.status); }
        return answer.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(id);
        if (!fresh) { return; }
        current.replaceWith(document.importNode(fresh, true));
        schedule(document.getElementById(id));
      })
      .catch(function () { schedule(current); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[id][data-refresh-ms]").forEach(schedule);
  });
})();
