// One BullMQ worker for the delayq peer benchmark (bench/peers/bullmq_node.py).
//
//   node bench/node/worker.js URL QUEUE SINK HOLD
//
// A `Worker` at BullMQ's defaults (concurrency 1, lockDuration 30 s, stalledInterval 30 s).
// Its processor, on each job start, appends "<i> <due> <now>\n" to SINK (opened once, append
// mode, one write(2) per line; now = Date.now() / 1000) and returns; with HOLD=1 it then waits
// an hour so that the job stays held (active, lock renewed) until the process is killed.
'use strict';

const fs = require('fs');
const { Worker } = require('bullmq');
const IORedis = require('ioredis');

const HOLD_MS = 3600 * 1000;

const [url, queueName, sink, holdArg] = process.argv.slice(2);
if (!url || !queueName || !sink) {
  console.error('usage: node worker.js URL QUEUE SINK HOLD');
  process.exit(2);
}
const hold = holdArg === '1';
const fd = fs.openSync(sink, 'a');

const connection = new IORedis(url, { maxRetriesPerRequest: null });
const worker = new Worker(
  queueName,
  async (job) => {
    const now = Date.now() / 1000;
    fs.writeSync(fd, `${job.data.i} ${job.data.due} ${now}\n`);
    if (hold) {
      await new Promise((resolve) => setTimeout(resolve, HOLD_MS));
    }
  },
  { connection },
);
worker.on('error', (err) => console.error('worker error:', err && err.message ? err.message : err));

// SIGTERM/SIGINT: close the worker (waits for the running job), at most 5 s, then exit.
function shutdown() {
  setTimeout(() => process.exit(0), 5000).unref();
  worker
    .close()
    .then(() => connection.quit())
    .finally(() => process.exit(0));
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
