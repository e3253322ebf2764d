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

// the ledger audit page: delivered, lost, duplicated and dead-lettered per UTC day (the page's own JSON)
(function () {
  var el = document.getElementById("audit-chart");
  if (!el || typeof uPlot === "undefined") { return; }
  fetch(el.dataset.src, { credentials: "same-origin", headers: { "Accept": "application/json" } })
    .then(function (r) { return r.json(); })
    .then(function (d) {
      var days = (d.days || []).slice().reverse();          // the page lists the newest first
      if (!days.length) { el.textContent = "no stored verdicts yet"; return; }
      var cols = [["delivered", "#31456e"], ["lost", "#c8372d"], ["duplicated", "#d98f1e"],
                  ["dead_letter", "#7d4cb0"]];
      var data = [days.map(function (x) { return Date.parse(x.day + "T00:00:00Z") / 1000; })];
      var series = [{ label: "day (UTC)" }];
      cols.forEach(function (c) {
        data.push(days.map(function (x) { return x[c[0]] || 0; }));
        series.push({ label: c[0].replace("_", " "), stroke: c[1], width: 2, points: { show: true, size: 6 } });
      });
      new uPlot({ width: Math.max(480, el.clientWidth - 20), height: 220, series: series,
                  axes: [{}, { label: "obligations" }],
                  // a day either side: one stored day is a point in the middle, not a range of years
                  scales: { x: { time: true, auto: false,
                                 range: [data[0][0] - 86400, data[0][data[0].length - 1] + 86400] } } },
                data, el);
    })
    .catch(function () { el.textContent = "chart data unavailable"; });
}());
