// triage console: the overview's live refresh. Polls api/overview under the overview's path
// (with a token the console lives under a secret path, /s/<hex>) and writes the counts and
// the breakers' phases into the page with textContent only (never HTML). Each refresh starts
// 5 s after the previous one finished (never two at once), and none runs while the tab is
// hidden.
"use strict";
(function () {
  if (!document.querySelector("[data-field]")) return;
  var EVERY_MS = 5000;
  var API = location.pathname.replace(/\/?$/, "/") + "api/overview";
  function pick(obj, path) {
    return path.split(".").reduce(function (o, k) { return o == null ? undefined : o[k]; }, obj);
  }
  // A time as the server prints it; one JavaScript cannot (past year 275760) as its number.
  function when(ms) {
    try {
      return new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");
    } catch (e) {
      return String(ms) + " ms after 1970";
    }
  }
  function openUntil(b) {
    if (b.forced) return "until an operator closes it";
    if (b.open_until_ms == null) return "-";
    return when(b.open_until_ms);
  }
  function show(data) {
    document.querySelectorAll("[data-field]").forEach(function (el) {
      var v = pick(data, el.getAttribute("data-field"));
      if (v !== undefined) el.textContent = String(v);
    });
    (data.breakers || []).forEach(function (b) {
      document.querySelectorAll("[data-breaker]").forEach(function (el) {
        if (el.getAttribute("data-breaker") !== b.job_type) return;
        var part = el.getAttribute("data-part");
        if (part === "phase") el.textContent = b.phase;
        else if (part === "failures") el.textContent = String(b.failures);
        else if (part === "executions") el.textContent = String(b.executions);
        else if (part === "open_until") el.textContent = openUntil(b);
      });
    });
    var at = document.getElementById("refreshed");
    if (at) at.textContent = when(data.at_ms);
    document.body.removeAttribute("data-stale");
  }
  var timer = null;
  var running = false;
  function schedule() {
    if (timer === null && !running && document.visibilityState !== "hidden") {
      timer = setTimeout(refresh, EVERY_MS);
    }
  }
  function refresh() {
    timer = null;
    if (document.visibilityState === "hidden") return;
    running = true;
    fetch(API, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(show)
      .catch(function () { document.body.setAttribute("data-stale", "true"); })
      .then(function () {
        running = false;
        schedule();
      });
  }
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "hidden") {
      if (timer !== null) clearTimeout(timer);
      timer = null;
    } else if (timer === null && !running) {
      refresh();
    }
  });
  schedule();
})();
