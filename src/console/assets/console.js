// triage console: the overview's live refresh. Polls /api/overview and writes the counts and
// the breakers' phases into the page with textContent only (never HTML).
"use strict";
(function () {
  if (!document.querySelector("[data-field]")) return;
  function pick(obj, path) {
    return path.split(".").reduce(function (o, k) { return o == null ? undefined : o[k]; }, obj);
  }
  function openUntil(b) {
    if (b.forced) return "until an operator closes it";
    if (b.open_until_ms == null) return "-";
    return new Date(b.open_until_ms).toISOString().replace(/\.\d+Z$/, "Z");
  }
  function refresh() {
    fetch("/api/overview", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (data) {
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
            else if (part === "open_until") el.textContent = openUntil(b);
          });
        });
        var at = document.getElementById("refreshed");
        if (at) at.textContent = new Date(data.at_ms).toISOString().replace(/\.\d+Z$/, "Z");
        document.body.removeAttribute("data-stale");
      })
      .catch(function () { document.body.setAttribute("data-stale", "true"); });
  }
  setInterval(refresh, 3000);
})();
