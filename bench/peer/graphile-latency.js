// graphile-worker's light-load latency, the peer of `bench.py latency`: one Node process runs a
// graphile-worker runner (--concurrency workers, default pollInterval; new jobs are picked up by
// LISTEN "jobs:insert", which graphile_worker.add_job NOTIFYs) and adds --warmup + --probes jobs
// through the runner's addJob (graphile_worker.add_job), one at a time at --rate per second. Each
// job's payload carries its send time (process.hrtime, this process's monotonic clock, which the
// task reads too); the task records its start. Two latencies per probe, in ms:
//   add_to_start     add_job sent -> the task function starts (dispatchd's Submit to worker)
//   add_answered     add_job sent -> its call returns (dispatchd's Submit answered)
// The first --warmup probes are left out. Prints one JSON object on stdout: p50, p90, p99, p999
// and max of each (nearest rank), the probes sent late, the seconds taken (and each list with
// --lists); then stops by itself.
//
//   node bench/peer/graphile-latency.js --url postgresql://USER@127.0.0.1:PORT/postgres \
//       [--db yardstick_lat] [--fresh] [--probes 1000] [--warmup 20] [--rate 100] \
//       [--concurrency 4] [--timeout 300] [--lists]
//
// --url names the server (any database on it, or PGURL); the probe runs in database --db on that
// server, created if missing (--fresh: dropped and created again), and graphile-worker installs
// its schema there itself. Needs graphile-worker 0.18 and pg 8 where Node finds them (bench.py
// sets NODE_PATH to the yardstick's cache).
"use strict";
const { EventEmitter } = require("events");
const fs = require("fs");
const path = require("path");
const { run, Logger } = require("graphile-worker");
const { Client } = require("pg");

function parseArgs(argv) {
  const o = { url: process.env.PGURL, db: "yardstick_lat", fresh: false, probes: 1000, warmup: 20,
              rate: 100, concurrency: 4, timeout: 300, lists: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const key = a.replace(/^--/, "");
    if (a === "--fresh" || a === "--lists") o[key] = true;
    else if (["--url", "--db"].includes(a)) o[key] = argv[++i];
    else if (["--probes", "--warmup", "--rate", "--concurrency", "--timeout"].includes(a)) {
      o[key] = Number(argv[++i]);
      if (!(o[key] >= 0)) throw new Error(`${a}: not a number: ${argv[i]}`);
    } else throw new Error(`unknown argument ${a}`);
  }
  if (!o.url) throw new Error("--url (or PGURL) names the PostgreSQL server");
  if (!/^[a-z_][a-z0-9_]*$/.test(o.db)) throw new Error(`--db: not a plain name: ${o.db}`);
  if (!(o.rate > 0) || !(o.probes >= 1) || !(o.concurrency >= 1)) {
    throw new Error("--rate, --probes and --concurrency must be positive");
  }
  return o;
}

function dbUrl(url, db) {
  const u = new URL(url);
  u.pathname = "/" + db;
  return u.toString();
}

// The probe's own database on the server of `url`: created if missing, or afresh.
async function prepareDb(o) {
  const c = new Client({ connectionString: o.url });
  await c.connect();
  try {
    if (o.fresh) await c.query(`drop database if exists "${o.db}" with (force)`);
    const r = await c.query("select 1 from pg_database where datname = $1", [o.db]);
    if (r.rowCount === 0) await c.query(`create database "${o.db}"`);
  } finally {
    await c.end();
  }
  return dbUrl(o.url, o.db);
}

// Nearest rank, as bench/harness.py and dispatch-loadgen compute it.
function percentile(sorted, q) {
  const k = Math.min(Math.max(Math.ceil(q * sorted.length), 1), sorted.length);
  return sorted[k - 1];
}

function summary(values) {
  const s = [...values].sort((a, b) => a - b);
  const r = (x) => Math.round(x * 1000) / 1000;
  return { p50: r(percentile(s, 0.5)), p90: r(percentile(s, 0.9)), p99: r(percentile(s, 0.99)),
           p999: r(percentile(s, 0.999)), max: r(s[s.length - 1]) };
}

// The package's own version (its package.json, which its "exports" do not list).
function graphileVersion() {
  const dist = path.dirname(require.resolve("graphile-worker"));
  return JSON.parse(fs.readFileSync(path.join(dist, "..", "package.json"), "utf8")).version;
}

const now = () => process.hrtime.bigint();
const ms = (ns) => Number(ns) / 1e6;
const sleep = (t) => new Promise((r) => setTimeout(r, t));

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const deadline = Date.now() + o.timeout * 1000;
  const connectionString = await prepareDb(o);
  const total = o.warmup + o.probes;
  const started = new Map(); // probe -> the task's start (hrtime ns)
  const events = new EventEmitter();
  const listening = new Promise((resolve) => events.once("pool:listen:success", resolve));
  const runner = await run({
    connectionString, concurrency: o.concurrency, noHandleSignals: true, events,
    logger: new Logger(() => () => {}),
    taskList: {
      probe: async (payload) => {
        const t = now();
        if (!started.has(payload.n)) started.set(payload.n, t);
      },
    },
  });
  try {
    await Promise.race([listening, sleep(30000).then(() => {
      throw new Error("graphile-worker did not LISTEN within 30 s");
    })]);
    const sent = new Array(total), answered = new Array(total);
    let late = 0;
    const interval = 1e9 / o.rate; // ns between sends
    const t0 = now();
    for (let n = 0; n < total; n++) {
      // Probe n leaves at t0 + n / rate, or at once (late, as dispatch-loadgen counts it) when
      // the previous add_job answered after that.
      const due = t0 + BigInt(Math.round(n * interval));
      if (n > 0 && answered[n - 1] > due) late++;
      const wait = ms(due - now());
      if (wait > 0) await sleep(wait);
      sent[n] = now();
      await runner.addJob("probe", { n, sent_ns: sent[n].toString() });
      answered[n] = now();
      if (Date.now() > deadline) throw new Error(`not done in --timeout ${o.timeout} s`);
    }
    while (started.size < total) {
      if (Date.now() > deadline) {
        throw new Error(`${total - started.size} of ${total} probe jobs did not start in ` +
                        `--timeout ${o.timeout} s`);
      }
      await sleep(5);
    }
    const seconds = ms(now() - t0) / 1000;
    const toStart = [], toAnswer = [];
    for (let n = o.warmup; n < total; n++) {
      toStart.push(ms(started.get(n) - sent[n]));
      toAnswer.push(ms(answered[n] - sent[n]));
    }
    const out = { peer: "graphile-worker", version: graphileVersion(),
                  probes: o.probes, warmup: o.warmup, rate: o.rate, concurrency: o.concurrency,
                  late_probes: late, seconds: Math.round(seconds * 1000) / 1000,
                  add_to_start_ms: summary(toStart), add_answered_ms: summary(toAnswer) };
    if (o.lists) {
      out.add_to_start_list_ms = toStart.map((x) => Math.round(x * 1000) / 1000);
      out.add_answered_list_ms = toAnswer.map((x) => Math.round(x * 1000) / 1000);
    }
    console.log(JSON.stringify(out));
  } finally {
    await runner.stop();
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(`graphile-latency: ${e && e.stack || e}`);
  process.exit(1);
});
