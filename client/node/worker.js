#!/usr/bin/env node
// A dispatchd worker in Node.js, written from proto/dispatchd/v1/worker_service.proto and the
// worker section of docs/api.md alone: no SDK, only grpc-js and proto-loader. It is what a worker
// in any gRPC language has to do, in one file:
//
//   node worker.js --server 127.0.0.1:7411 --worker-id node-0 --types reverse
//                  [--slots 2] [--max-concurrent N] [--work-ms 100] [--proto-dir DIR]
//
// Each job's output is its payload reversed, after --work-ms of pretend work; a payload of
// "fail" fails (not retryable). The worker advertises --slots and runs at most --max-concurrent
// jobs (default: --slots); an assignment beyond that is refused with REASON_RESOURCE_EXHAUSTED.
// --server takes a comma-separated list of daemons; a standby's Redirect is followed at once.
// SIGTERM or SIGINT drains: no new jobs, the running ones finish and their results are
// acknowledged, then it exits 0. A Drain from the daemon does the same. It logs one line per event
// (`accept job=ID attempt=N`, `reject job=ID attempt=N reason=...`, `result job=ID ...`).

'use strict';

const os = require('os');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE =
  'usage: node worker.js --server HOST:PORT[,HOST:PORT...] --worker-id ID --types T1[,T2...] ' +
  '[--slots N] [--max-concurrent N] [--work-ms N] [--proto-dir DIR]';
const opts = parseArgs(process.argv.slice(2));

// The contract, loaded from the .proto at run time. With `oneofs: true` a received message names
// its set field in `msg` (e.g. m.msg === 'assign'); to send one, set just that field.
const v1 = grpc.loadPackageDefinition(protoLoader.loadSync('dispatchd/v1/worker_service.proto', {
  includeDirs: [opts.protoDir],
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
})).dispatchd.v1;

// ---- The work: replace with yours. `signal` aborts when the daemon cancels the job. ----

async function handle(assignment, signal) {
  await sleep(opts.workMs, signal);
  const text = assignment.payload.toString('utf8');
  if (text === 'fail') throw Object.assign(new Error('asked to fail'), {retryable: false});
  return Buffer.from([...text].reverse().join(''), 'utf8');
}

// ---- The protocol. ----

// Every job this worker holds, by "id/attempt": running (result null), or finished with a Result
// the daemon has not acknowledged yet. Heartbeats list them all, and a Hello after a reconnect
// reports them so that the daemon re-adopts them; unacknowledged results are sent again.
const held = new Map();
let running = 0;             // held jobs whose handler has not returned
let draining = false;
let refusedSinceHeartbeat = false;
let session = null;          // {stream, welcomed}, the current stream
let heartbeatTimer = null;
let servers = opts.servers;  // where to connect, in order
let redirectTo = null;       // a standby named the leader: connect there next
let backoffMs = 250;

const key = (jobId, attempt) => `${jobId}/${attempt}`;
const heldJobs = () => [...held.values()].map(({job_id, attempt}) => ({job_id, attempt}));

function send(message) {
  if (session !== null && session.welcomed) session.stream.write(message);
}

function heartbeat() {
  refusedSinceHeartbeat = false;
  send({heartbeat: {
    running_jobs: heldJobs(),
    ram_used_bytes: os.totalmem() - os.freemem(),
    ram_total_bytes: os.totalmem(),
  }});
}

function connect() {
  const address = redirectTo || servers[0];
  redirectTo = null;
  const client = new v1.WorkerService(address, grpc.credentials.createInsecure());
  const stream = client.Connect();
  const mine = {stream, welcomed: false};
  session = mine;
  // The first message must be a Hello; nothing else goes out before the Welcome.
  stream.write({hello: {
    worker_id: opts.workerId, types: opts.types, slots: opts.slots, running_jobs: heldJobs(),
  }});
  stream.on('data', (m) => onMessage(mine, m));
  stream.on('error', () => {});  // the 'status' event below reports every end
  stream.on('status', (status) => {
    client.close();
    if (session === mine) session = null;
    clearInterval(heartbeatTimer);
    if (draining && held.size === 0) process.exit(0);
    if (!redirectTo) {
      console.log(`stream ended code=${status.code} (${status.details}); reconnecting`);
      servers = [...servers.slice(1), servers[0]];  // the next daemon of the list
    }
    const delay = redirectTo ? 0 : backoffMs * (0.5 + Math.random());
    backoffMs = Math.min(backoffMs * 2, 5000);
    setTimeout(connect, delay);
  });
}

function onMessage(mine, m) {
  switch (m.msg) {
    case 'welcome': {
      mine.welcomed = true;
      backoffMs = 250;
      const d = m.welcome.heartbeat_interval;
      const intervalMs = d ? d.seconds * 1000 + d.nanos / 1e6 : 1000;
      // Jobs the daemon did not re-adopt are no longer ours: stop them, drop their results.
      const adopted = new Set(m.welcome.adopted_jobs.map((j) => key(j.job_id, j.attempt)));
      for (const [k, job] of held) {
        if (!adopted.has(k)) {
          job.abort.abort('not adopted after reconnect');
          held.delete(k);
        }
      }
      console.log(`welcome session=${m.welcome.session_id} heartbeat_ms=${intervalMs} ` +
                  `adopted=${adopted.size}`);
      for (const job of held.values()) if (job.result) send({result: job.result});
      if (draining) send({draining: {}});
      heartbeatTimer = setInterval(heartbeat, intervalMs);
      finishDrainIfDone();
      break;
    }
    case 'redirect':  // a standby: the stream ends UNAVAILABLE right after this
      redirectTo = m.redirect.leader_address || null;
      console.log(`redirect to=${redirectTo || '(no leader yet)'}`);
      break;
    case 'assign':
      for (const a of m.assign.assignments) offer(a);
      break;
    case 'cancel':  // stop the job; its Result still goes out, and is ignored
      held.get(key(m.cancel.job_id, m.cancel.attempt))?.abort.abort(m.cancel.reason);
      break;
    case 'result_ack':
      acknowledged(m.result_ack);
      break;
    case 'result_acks':  // only sent to a worker whose Hello set `batching`
      m.result_acks.acks.forEach(acknowledged);
      break;
    case 'drain':
      startDrain('the daemon asked');
      break;
    case 'stopping':  // the daemon stops: no new work here; finish, then go on down the list
      console.log(`daemon stopping: ${m.stopping.message}`);
      break;
  }
}

// Answers one assignment with Accept or Reject, then runs it.
function offer(a) {
  const id = {job_id: a.job_id, attempt: a.attempt};
  let reason = null;
  if (draining) {
    reason = 'REASON_DRAINING';
  } else if (!opts.types.includes(a.type)) {
    reason = 'REASON_UNSUPPORTED';
  } else if (running >= opts.maxConcurrent && !held.has(key(a.job_id, a.attempt))) {
    // Task-count backpressure: the worker, not the daemon, is the authority on its capacity.
    reason = 'REASON_RESOURCE_EXHAUSTED';
    refusedSinceHeartbeat = true;
  }
  if (reason) {
    console.log(`reject job=${a.job_id} attempt=${a.attempt} reason=${reason}`);
    send({reject: {...id, reason, message: `${running} of ${opts.maxConcurrent} running`}});
    return;
  }
  send({accept: id});
  if (held.has(key(a.job_id, a.attempt))) return;  // offered again after a reconnect: runs once
  console.log(`accept job=${a.job_id} attempt=${a.attempt}`);
  run(a);
}

async function run(a) {
  const k = key(a.job_id, a.attempt);
  const job = {job_id: a.job_id, attempt: a.attempt, abort: new AbortController(), result: null};
  held.set(k, job);
  ++running;
  const started = process.hrtime.bigint();
  const result = {job_id: a.job_id, attempt: a.attempt};
  try {
    result.output = await handle(a, job.abort.signal);
  } catch (e) {
    const message = job.abort.signal.aborted ? `cancelled: ${job.abort.signal.reason}` : e.message;
    result.failure = {message, retryable: Boolean(e.retryable)};
  }
  --running;
  const ns = process.hrtime.bigint() - started;
  // The handler's true run time: what the daemon charges the job's client and learns costs from.
  result.run_time = {seconds: Number(ns / 1000000000n), nanos: Number(ns % 1000000000n)};
  if (held.get(k) !== job) return;  // dropped at a Welcome that did not adopt it
  job.result = result;
  console.log(`result job=${a.job_id} attempt=${a.attempt} ` +
              (result.failure ? `failure=${result.failure.message}` : 'ok'));
  send({result});  // kept in `held` until acknowledged; resent after a reconnect
  // After a refusal the daemon sends no more than we hold until our next heartbeat: send it now.
  if (refusedSinceHeartbeat && !draining) heartbeat();
}

function acknowledged(ack) {
  const k = key(ack.job_id, ack.attempt);
  if (held.get(k)?.result) held.delete(k);
  finishDrainIfDone();
}

function startDrain(why) {
  if (draining) return;
  draining = true;
  console.log(`draining (${why}) running=${running}`);
  send({draining: {}});
  finishDrainIfDone();
}

// A drained worker closes its side once every result is acknowledged; the daemon then ends the
// stream and the 'status' handler exits.
function finishDrainIfDone() {
  if (!draining || held.size > 0) return;
  if (session === null) process.exit(0);
  if (session.welcomed) session.stream.end();
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new Error('aborted'));
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      reject(new Error('aborted'));
    }, {once: true});
  });
}

function parseArgs(argv) {
  const o = {servers: [], workerId: '', types: [], slots: 1, maxConcurrent: 0, workMs: 100,
    protoDir: path.join(__dirname, '..', '..', 'proto')};
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) usage(`${flag} needs a value`);
    const count = () => {
      const n = Number(value);
      if (!Number.isInteger(n) || n < 0) usage(`${flag}: want a whole number, got ${value}`);
      return n;
    };
    switch (flag) {
      case '--server': o.servers = value.split(',').filter(Boolean); break;
      case '--worker-id': o.workerId = value; break;
      case '--types': o.types = value.split(',').filter(Boolean); break;
      case '--slots': o.slots = count(); break;
      case '--max-concurrent': o.maxConcurrent = count(); break;
      case '--work-ms': o.workMs = count(); break;
      case '--proto-dir': o.protoDir = value; break;
      default: usage(`unknown flag ${flag}`);
    }
  }
  if (o.servers.length === 0 || !o.workerId || o.types.length === 0 || o.slots < 1) {
    usage('--server, --worker-id, --types and --slots >= 1 are required');
  }
  if (o.maxConcurrent === 0) o.maxConcurrent = o.slots;
  return o;
}

function usage(problem) {
  console.error(`worker.js: ${problem}\n${USAGE}`);
  process.exit(2);
}

process.on('SIGTERM', () => startDrain('SIGTERM'));
process.on('SIGINT', () => startDrain('SIGINT'));
connect();
