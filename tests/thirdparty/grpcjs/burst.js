#!/usr/bin/env node
// A burst of calls at a dispatchd from grpc-js, a gRPC implementation that shares no code with the
// daemon's: many fresh channels, each its own connection, opened at once, with no retry policy.
// Every valid call must reach its handler (gRPC servers answer UNIMPLEMENTED, with no message,
// when a handler throws or a request does not parse), and a malformed body must be refused with
// INVALID_ARGUMENT and a message, whichever client library sent it.
//
//   node burst.js --address HOST:PORT [--channels 20] [--calls 1000] [--depth 3]
//                 [--deadline-ms 30000]
//
// Per channel: --calls valid calls, the first 5 Submit of type "echo" (a daemon with a small
// `max_active` refuses most with RESOURCE_EXHAUSTED), the rest Status of unknown ids (NOT_FOUND);
// --depth of them in flight at a time. Mixed in: one call of each malformed body below.
// Prints one summary line; exits 0 only if every call got an expected code, else 1 (2: usage).

'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE =
  'usage: node burst.js --address HOST:PORT [--channels N] [--calls N] [--depth N] ' +
  '[--deadline-ms N]';

function parseArgs(argv) {
  const opts = {address: '', channels: 20, calls: 1000, depth: 3, deadlineMs: 30000};
  const numeric = {'--channels': 'channels', '--calls': 'calls', '--depth': 'depth',
    '--deadline-ms': 'deadlineMs'};
  for (let i = 0; i < argv.length; ++i) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === '--help' || flag === '-h') {
      console.log(USAGE);
      process.exit(0);
    }
    if (value === undefined) usage(`${flag} needs a value`);
    ++i;
    if (flag === '--address') {
      opts.address = value;
    } else if (Object.hasOwn(numeric, flag)) {
      const n = Number(value);
      if (!Number.isInteger(n) || n < 1) usage(`${flag}: want a positive integer, got ${value}`);
      opts[numeric[flag]] = n;
    } else {
      usage(`unknown flag ${flag}`);
    }
  }
  if (!opts.address) usage('--address is required');
  return opts;
}

function usage(problem) {
  console.error(`burst.js: ${problem}\n${USAGE}`);
  process.exit(2);
}

// Bodies no valid message encodes. Each must be answered INVALID_ARGUMENT by the method's own
// parsing, never UNIMPLEMENTED (what gRPC's generated handlers answer to a body they cannot
// parse).
const MALFORMED = [
  // Field 31, wire type 7: no such wire type.
  {method: 'Submit', body: [0xff, 0xff, 0xff]},
  // Field 1 as a varint whose continuation bit promises a byte that never comes.
  {method: 'Status', body: [0x08, 0x80]},
  // Field 1 claims 5 bytes, 2 follow.
  {method: 'Status', body: [0x0a, 0x05, 0x61, 0x62]},
  // A SubmitRequest whose spec.type (field 1 of field 1) is not UTF-8: 0xC3 starts a two-byte
  // sequence that 0x28 does not continue.
  {method: 'Submit', body: [0x0a, 0x04, 0x0a, 0x02, 0xc3, 0x28]},
  // A StatusRequest whose job_id is not UTF-8.
  {method: 'Status', body: [0x0a, 0x02, 0xc3, 0x28]},
];

const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, n]) => [n, name]));
const codeName = (code) => CODE_NAMES[code] || `code ${code}`;

function loadJobService() {
  // The repository's protos, wherever the script is run from.
  const protoRoot = path.resolve(__dirname, '..', '..', '..', 'proto');
  const definition = protoLoader.loadSync('dispatchd/v1/job_service.proto', {
    includeDirs: [protoRoot],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  return grpc.loadPackageDefinition(definition).dispatchd.v1.JobService;
}

function deadline(ms) {
  return new Date(Date.now() + ms);
}

// Runs `calls` valid calls and the malformed ones on one client, `depth` at a time; records each
// answer in `tally`.
async function runChannel(client, t, opts, tally) {
  const valid = (i) => new Promise((resolve) => {
    const done = (method) => (err) => {
      tally.valid(method, err ? err.code : grpc.status.OK, err ? err.details : '');
      resolve();
    };
    const options = {deadline: deadline(opts.deadlineMs)};
    if (i < 5) {
      const spec = {type: 'echo', payload: Buffer.from(`${t}.${i}`)};
      client.Submit({spec}, options, done('Submit'));
    } else {
      client.Status({job_id: `j_burst_${t}_${i}`}, options, done('Status'));
    }
  });
  const malformed = (m) => new Promise((resolve) => {
    client.makeUnaryRequest(
        `/dispatchd.v1.JobService/${m.method}`,
        () => Buffer.from(m.body),  // whatever the argument, these bytes go on the wire
        (bytes) => bytes,
        {},
        new grpc.Metadata(),
        {deadline: deadline(opts.deadlineMs)},
        (err) => {
          tally.malformed(m, err ? err.code : grpc.status.OK, err ? err.details : '');
          resolve();
        });
  });
  // The work list: the valid calls in order, one malformed body every few of them, starting
  // with the first few calls (the burst a daemon has just started sees).
  const work = [];
  const every = Math.max(1, Math.floor(opts.calls / MALFORMED.length));
  let next = 0;
  for (let i = 0; i < opts.calls; ++i) {
    if (i % every === 1 && next < MALFORMED.length) {
      const m = MALFORMED[(next++ + t) % MALFORMED.length];
      work.push(() => malformed(m));
    }
    work.push(() => valid(i));
  }
  while (next < MALFORMED.length) {
    const m = MALFORMED[(next++ + t) % MALFORMED.length];
    work.push(() => malformed(m));
  }
  let cursor = 0;
  const lane = async () => {
    while (cursor < work.length) await work[cursor++]();
  };
  await Promise.all(Array.from({length: opts.depth}, lane));
}

class Tally {
  constructor() {
    this.codes = new Map();  // valid calls: code -> count
    this.malformedCodes = new Map();
    this.problems = [];  // the first few
    this.problemCount = 0;
  }

  valid(method, code, details) {
    this.codes.set(code, (this.codes.get(code) || 0) + 1);
    // Submit of a known type is queued or refused for capacity; an unknown id is NOT_FOUND.
    const expected = method === 'Submit' ?
        [grpc.status.OK, grpc.status.RESOURCE_EXHAUSTED] : [grpc.status.NOT_FOUND];
    if (!expected.includes(code)) {
      this.problem(`${method} answered ${codeName(code)}: ${JSON.stringify(details)}`);
    }
  }

  malformed(m, code, details) {
    this.malformedCodes.set(code, (this.malformedCodes.get(code) || 0) + 1);
    const body = Buffer.from(m.body).toString('hex');
    if (code !== grpc.status.INVALID_ARGUMENT) {
      this.problem(`${m.method} with malformed body ${body} answered ${codeName(code)}: ` +
          `${JSON.stringify(details)}, want INVALID_ARGUMENT`);
    } else if (!details) {
      this.problem(`${m.method} with malformed body ${body}: INVALID_ARGUMENT with no message`);
    }
  }

  // Keeps the first few so that a broken daemon does not flood the output.
  problem(text) {
    if (this.problems.length < 20) this.problems.push(text);
    ++this.problemCount;
  }
}

// "NAME=n ..." for `always` (even when 0), then any other code that occurred.
function format(codes, always) {
  const others = [...codes.keys()].filter((c) => !always.includes(c)).sort((a, b) => a - b);
  return [...always, ...others].map((c) => `${codeName(c)}=${codes.get(c) || 0}`).join(' ');
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const JobService = loadJobService();
  // A channel of its own per client: without a local subchannel pool grpc-js would share one
  // connection between channels of equal target and options. No retries, so that a call
  // answered UNIMPLEMENTED (or anything else) is seen as it was answered.
  const clients = [];
  for (let t = 0; t < opts.channels; ++t) {
    clients.push(new JobService(opts.address, grpc.credentials.createInsecure(), {
      'grpc.use_local_subchannel_pool': 1,
      'grpc.enable_retries': 0,
    }));
  }
  const tally = new Tally();
  const start = process.hrtime.bigint();
  // Channels connect on their first call: all of them at once here.
  await Promise.all(clients.map((client, t) => runChannel(client, t, opts, tally)));
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  for (const client of clients) client.close();

  let total = 0;
  for (const n of tally.codes.values()) total += n;
  let malformedTotal = 0;
  for (const n of tally.malformedCodes.values()) malformedTotal += n;
  const want = opts.channels * opts.calls;
  const wantMalformed = opts.channels * MALFORMED.length;
  const s = grpc.status;
  console.log(`grpcjs burst: ${total} calls from ${opts.channels} fresh channels: ` +
      `${format(tally.codes, [s.OK, s.NOT_FOUND, s.RESOURCE_EXHAUSTED])} ` +
      `malformed: ${format(tally.malformedCodes, [s.INVALID_ARGUMENT])} ` +
      `(${seconds.toFixed(1)} s)`);

  const wrong = [];
  if (total !== want) wrong.push(`${total} valid calls answered, want ${want}`);
  if (malformedTotal !== wantMalformed) {
    wrong.push(`${malformedTotal} malformed calls answered, want ${wantMalformed}`);
  }
  const unimplemented = (tally.codes.get(grpc.status.UNIMPLEMENTED) || 0) +
      (tally.malformedCodes.get(grpc.status.UNIMPLEMENTED) || 0);
  if (unimplemented > 0) wrong.push(`${unimplemented} calls answered UNIMPLEMENTED`);
  if (tally.problemCount > 0) {
    wrong.push(`${tally.problemCount} unexpected answers, the first ${tally.problems.length}:`);
    wrong.push(...tally.problems.map((p) => `  ${p}`));
  }
  if (wrong.length > 0) {
    console.log(`grpcjs burst: FAILED\n${wrong.join('\n')}`);
    process.exit(1);
  }
  process.exit(0);
}

main().catch((err) => {
  console.error(`grpcjs burst: FAILED: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
