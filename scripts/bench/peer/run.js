// Peer benchmark driver for scripts/bench/peer.sh (run it through that script,
// which installs graphile-worker and sets NODE_PATH).
//
// In a fresh database: install the graphile-worker schema and queue JOBS jobs
// (untimed), then start a worker (run(), CONCURRENCY workers) and time until
// the job table is empty.  PEER_MODE says what a job is:
//   noop   one stage: a task that does nothing;
//   chain  two stages, the way graphile-worker's documentation chains them:
//          the first task adds the second job (`helpers.addJob`), whose task
//          does nothing.  A document is done when its second job is.
// Prints one JSON object on stdout; everything else goes to stderr.  The
// database is dropped afterwards.
"use strict";
const { Client, Pool } = require("pg");
const { run, runMigrations, Logger } = require("graphile-worker");

const jobs = Number(process.env.PEER_JOBS);
const concurrency = Number(process.env.PEER_CONCURRENCY);
const adminUrl = process.env.PEER_DATABASE_URL;
const mode = process.env.PEER_MODE || "noop";
// The task queued, and the jobs each document runs.
const FIRST = { noop: "noop", chain: "first" }[mode];
const STAGES = { noop: 1, chain: 2 }[mode];
const BATCH = 10000;

const log = (msg) => process.stderr.write(`[peer] ${msg}\n`);
// Only warnings and errors: graphile-worker logs every completed job at info.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") log(`${level}: ${message}`);
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// SIGINT/SIGTERM: stop at the next check so the database still gets dropped.
let stopSignal = null;
for (const sig of ["SIGINT", "SIGTERM"]) process.once(sig, () => { stopSignal = sig; });
const checkSignal = () => { if (stopSignal) throw new Error(`interrupted by ${stopSignal}`); };

async function withClient(url, fn) {
  const c = new Client({ connectionString: url });
  await c.connect();
  try { return await fn(c); } finally { await c.end(); }
}

async function withPoolClient(pool, fn) {
  const c = await pool.connect();
  try { return await fn(c); } finally { c.release(); }
}

// One pool of our own for graphile-worker and us, closed (awaited) before the
// database is dropped; graphile-worker's own pool is not awaited on stop.
// Size: the workers, graphile-worker's LISTEN client and our polling client.
async function bench(url) {
  const pgPool = new Pool({ connectionString: url, max: concurrency + 2 });
  pgPool.on("error", (err) => log(`pool: ${err.message}`));
  try { return await benchWith(pgPool); } finally { await pgPool.end(); }
}

async function benchWith(pgPool) {
  await runMigrations({ pgPool, logger });
  await withPoolClient(pgPool, async (c) => {
    for (let left = jobs; left > 0; left -= BATCH) {
      checkSignal();
      await c.query(
        `select count(*) from graphile_worker.add_jobs(array(
           select row($2::text, null, null, null, null, null, null, null)::graphile_worker.job_spec
           from generate_series(1, $1)))`,
        [Math.min(BATCH, left), FIRST],
      );
    }
  });
  log(`queued ${jobs} jobs; starting worker (concurrency ${concurrency})`);

  return withPoolClient(pgPool, async (c) => {
    const count = async () =>
      Number((await c.query("select count(*) from graphile_worker._private_jobs")).rows[0].count);
    const empty = async () =>
      (await c.query("select not exists (select 1 from graphile_worker._private_jobs) as e")).rows[0].e;
    if ((await count()) !== jobs) throw new Error(`queued ${await count()} jobs, wanted ${jobs}`);
    let failures = 0;
    let secondRuns = 0; // second-stage jobs run
    const t0 = process.hrtime.bigint();
    const runner = await run({
      pgPool,
      concurrency,
      noHandleSignals: true,
      pollInterval: 100,
      logger,
      taskList: {
        noop: async () => {},
        first: async (_payload, helpers) => { await helpers.addJob("second", {}); },
        second: async () => { secondRuns += 1; },
      },
    });
    runner.events.on("job:error", () => { failures += 1; });
    try {
      while (!(await empty())) {
        if (failures > 0) throw new Error(`${failures} job(s) failed`);
        checkSignal();
        await sleep(50);
      }
      const took = Number(process.hrtime.bigint() - t0) / 1e9;
      if (mode === "chain" && secondRuns !== jobs) throw new Error(`${secondRuns} second-stage jobs ran, wanted ${jobs}`);
      return took;
    } finally {
      await runner.stop();
      await runner.promise;
    }
  });
}

async function main() {
  if (!(jobs > 0 && concurrency > 0 && adminUrl)) throw new Error("PEER_JOBS, PEER_CONCURRENCY, PEER_DATABASE_URL required");
  if (!FIRST) throw new Error(`PEER_MODE must be noop or chain, not ${mode}`);
  const db = `bench_peer_${process.pid}_${Date.now()}`;
  const url = new URL(adminUrl);
  url.pathname = `/${db}`;
  await withClient(adminUrl, (c) => c.query(`create database ${db}`));
  log(`created database ${db}`);
  let seconds;
  try {
    seconds = await bench(url.toString());
  } finally {
    await withClient(adminUrl, (c) => c.query(`drop database if exists ${db} with (force)`));
    log(`dropped database ${db}`);
  }
  const version = require("graphile-worker/package.json").version;
  console.log(JSON.stringify({
    peer: "graphile-worker", version, mode, stages: STAGES, documents: jobs, jobs: jobs * STAGES, concurrency,
    seconds: Number(seconds.toFixed(3)),
    jobs_per_s: Math.round((jobs * STAGES) / seconds),
    documents_per_s: Math.round(jobs / seconds),
  }));
}

main().catch((err) => {
  log(`ERROR: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
