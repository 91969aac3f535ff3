// txoutbox-bench's peer: drains N no-op jobs with graphile-worker 0.18 in its high-throughput
// setting (a local queue of LQ jobs, batched completions, CONC concurrent tasks) and prints one
// JSON line: {"rows":N,"secs":S,"rows_per_sec":R}. The server is given by the PG* variables.
const { run, runMigrations, Logger } = require("graphile-worker");
const { Pool } = require("pg");
const quiet = new Logger(() => () => {});
const N = parseInt(process.env.N || "100000");
const CONC = parseInt(process.env.CONC || "24");
const LQ = parseInt(process.env.LQ || "500");
(async () => {
  const pgPool = new Pool({ max: CONC + 4 });
  await runMigrations({ pgPool, logger: quiet });
  await pgPool.query("delete from graphile_worker._private_jobs");
  await pgPool.query(`select graphile_worker.add_jobs(array(select row('noop', json_build_object('n', g), null, null, null, null, null, null)::graphile_worker.job_spec from generate_series(1, $1) g))`, [N]);
  await pgPool.query("vacuum analyze graphile_worker._private_jobs");
  const preset = { worker: {} };
  if (LQ > 0) { preset.worker.localQueue = { size: LQ }; preset.worker.completeJobBatchDelay = 0; preset.worker.failJobBatchDelay = 0; }
  // Timed as the relay's drain is: the task calls are counted in the process, and the table is
  // read only once every call is made, until the last completions have committed.
  let calls = 0;
  const t0 = process.hrtime.bigint();
  const runner = await run({ pgPool, concurrency: CONC, noHandleSignals: true, pollInterval: 100, taskList: { noop: async () => { calls++; } }, preset, logger: quiet });
  while (calls < N) await new Promise(r => setTimeout(r, 5));
  for (;;) {
    const r = await pgPool.query("select count(*)::int n from graphile_worker._private_jobs");
    if (r.rows[0].n === 0) break;
    await new Promise(r => setTimeout(r, 2));
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await runner.stop();
  await pgPool.end();
  console.log(JSON.stringify({ rows: N, secs, rows_per_sec: N / secs }));
  process.exit(0);
})().catch(e => { console.error(e); process.exit(1); });
