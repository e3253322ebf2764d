// nsjms console: the overview's events/s chart (uPlot, vendored). No inline script: the CSP forbids it.
"use strict";
(function () {
  var el = document.getElementById("rates");
  if (!el || typeof uPlot === "undefined") { return; }
  var palette = ["#31456e", "#c8372d", "#2e9d5b", "#d98f1e", "#7d4cb0", "#1a8fa8"];
  function draw(rates) {
    var ids = Object.keys(rates.bridges);
    el.textContent = "";
    if (!rates.t.length || !ids.length) { el.textContent = "no samples yet (one every 2 s)"; return; }
    var data = [rates.t].concat(ids.map(function (id) { return rates.bridges[id]; }));
    var series = [{}].concat(ids.map(function (id, i) {
      return { label: "bridge " + id, stroke: palette[i % palette.length], width: 2, spanGaps: false };
    }));
    if (rates.dead_lettered && rates.dead_lettered.length) {   // a bridge's page: its dead letters too
      data.push(rates.dead_lettered);
      series.push({ label: "dead-lettered", stroke: "#b3261e", width: 2, spanGaps: false });
    }
    if (rates.total && ids.length > 1) {   // the busiest bridges are drawn one by one, all of them together too
      data.push(rates.total);
      series.push({ label: "all " + rates.of + " bridges", stroke: "#555", width: 1, dash: [4, 4] });
    }
    new uPlot({ width: Math.max(480, el.clientWidth - 20), height: 220, series: series,
                axes: [{}, { label: "events/s" }], scales: { x: { time: true } } }, data, el);
  }
  function refresh() {
    fetch(el.dataset.src, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (d) { draw(d); })
      .catch(function () { el.textContent = "chart data unavailable"; });
  }
  refresh();
  setInterval(refresh, 5000);
}());

// an audit run's page follows the run while it goes: its state and log every 3 s, the page again once it ended
(function () {
  var state = document.getElementById("run-state");
  if (!state || state.textContent !== "running" || !state.dataset.src) { return; }
  function poll() {
    fetch(state.dataset.src, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        var log = document.getElementById("run-log");
        if (log && d.log) { log.textContent = d.log.join("\n") + "\n"; }
        if (d.state !== "running") { window.location.reload(); return; }
        setTimeout(poll, 3000);
      })
      .catch(function () { setTimeout(poll, 10000); });
  }
  setTimeout(poll, 3000);
}());
