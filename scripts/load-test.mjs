// A bounded, loopback-only load test of `kvlm serve`: CLIENTS concurrent loops for SECONDS issue
// streaming and non-streaming chat / completion requests (random lengths, a shared long prefix,
// long prompts near the pool's size, ignore_eos, n > 1, eviction policies), cancel some mid-stream,
// drop some connections at the socket (mid-stream, or in the middle of sending the request), and
// send some invalid ones. Every request must end in exactly one of: success (each choice finished,
// then [DONE]), a proper error (a JSON error object with the expected status; 429 with Retry-After
// is counted and retried later), or an intentional cancel or disconnect. Anything else is "lost"
// and fails the run. Afterwards the server must be healthy, hold no KV blocks, run no requests,
// still generate, and exit 0 on SIGTERM. With --rss-growth-limit (the soak, scripts/soak.sh) the
// server's resident memory is sampled and must not grow more than that after the warm-up.
//
//   node scripts/load-test.mjs --kvlm build/kvlm [--seconds 60] [--clients 64] [--json] [--seed N]
//        [--pool-blocks 96] [--max-seqs 32] [--max-queue 64] [--threads N] [--server-arg ARG]...
//        [--rss-growth-limit PCT] [--warmup SECONDS]
//
// Exit 0 only when lost == 0, unexpected == 0 and the post-checks hold.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';

// ---- options ----
const opts = {
  kvlm: process.env.KVLM ?? 'build/kvlm',
  seconds: 60,
  clients: 64,
  json: false,
  seed: Date.now() % 1_000_000,
  poolBlocks: 96,
  maxSeqs: 32,
  maxQueue: 64,
  blockSize: 16,
  threads: 0,
  requestTimeout: 60,   // client-side: a request still open after this is lost (a stall)
  serverArgs: [],
  verbose: false,
  rssGrowthLimit: null,  // percent; null: RSS is reported, not checked
  warmup: null,          // seconds before the RSS baseline; default a fifth of the run, at most 300
};
{
  const a = process.argv.slice(2);
  const num = (i) => {
    const v = Number(a[i + 1]);
    if (!Number.isFinite(v)) usage(`${a[i]} needs a number`);
    return v;
  };
  for (let i = 0; i < a.length; i++) {
    switch (a[i]) {
      case '--kvlm': opts.kvlm = a[++i]; break;
      case '--seconds': opts.seconds = num(i); i++; break;
      case '--clients': opts.clients = num(i); i++; break;
      case '--json': opts.json = true; break;
      case '--seed': opts.seed = num(i); i++; break;
      case '--pool-blocks': opts.poolBlocks = num(i); i++; break;
      case '--max-seqs': opts.maxSeqs = num(i); i++; break;
      case '--max-queue': opts.maxQueue = num(i); i++; break;
      case '--block-size': opts.blockSize = num(i); i++; break;
      case '--threads': opts.threads = num(i); i++; break;
      case '--request-timeout': opts.requestTimeout = num(i); i++; break;
      case '--server-arg': opts.serverArgs.push(a[++i]); break;
      case '--rss-growth-limit': opts.rssGrowthLimit = num(i); i++; break;
      case '--warmup': opts.warmup = num(i); i++; break;
      case '--verbose': case '-v': opts.verbose = true; break;
      case '--help': case '-h': usage(); break;
      default: usage(`unknown argument ${a[i]}`);
    }
  }
}
function usage(why) {
  if (why) console.error(`load-test: ${why}`);
  console.error('usage: node scripts/load-test.mjs [--kvlm PATH] [--seconds 60] [--clients 64] [--json] [--seed N]\n' +
                '       [--pool-blocks 96] [--max-seqs 32] [--max-queue 64] [--block-size 16] [--threads N]\n' +
                '       [--request-timeout 60] [--server-arg ARG]... [--rss-growth-limit PCT] [--warmup SECONDS]\n' +
                '       [--verbose]');
  process.exit(why ? 2 : 0);
}
if (!existsSync(opts.kvlm)) {
  console.error(`load-test: no kvlm binary at ${opts.kvlm} (build it, or set KVLM / --kvlm)`);
  process.exit(2);
}
const info = (...m) => { if (!opts.json) console.error(...m); };

// ---- a seeded PRNG (mulberry32), so a run's request mix can be repeated ----
let prngState = opts.seed >>> 0;
function rand() {
  prngState = (prngState + 0x6d2b79f5) >>> 0;
  let t = prngState;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const randint = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));  // inclusive
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- the server ----
const MODEL = 'stories260K';
let server;
let serverExit;
let serverGone = null;  // set when the server exits on its own during the run
const inFlight = new Set();  // the plans being answered, reported if the server dies
let inFlightAtExit = null;
let stopping = false;  // the SIGTERM at the end is ours
const serverLog = [];
function startServer() {
  const args = ['serve', '--host', '127.0.0.1', '--port', '0', '--pool-blocks', String(opts.poolBlocks),
                '--block-size', String(opts.blockSize), '--max-seqs', String(opts.maxSeqs),
                '--max-queue', String(opts.maxQueue), '--shutdown-timeout', '10', '--max-body', '1MiB'];
  if (opts.threads > 0) args.push('--threads', String(opts.threads));
  args.push(...opts.serverArgs);
  info(`load-test: ${opts.kvlm} ${args.join(' ')}`);
  server = spawn(opts.kvlm, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  serverExit = new Promise((r) => server.on('exit', (code, signal) => r({ code, signal })));
  serverExit.then((r) => {
    if (stopping) return;
    serverGone = r;
    inFlightAtExit = [...inFlight].map((p) => `POST ${p.path} ${p.body.slice(0, 400)}`);
  });
  return new Promise((resolve, reject) => {
    let port = null;
    let pending = '';
    const onData = (d) => {
      pending += d.toString();
      const lines = pending.split('\n');
      pending = lines.pop();
      for (const line of lines) {
        serverLog.push(line);
        if (serverLog.length > 400) serverLog.shift();
        if (opts.verbose) console.error(`[server] ${line}`);
        const m = port === null && line.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
        if (m) { port = Number(m[1]); resolve(port); }
      }
    };
    server.stdout.on('data', onData);
    server.stderr.on('data', onData);
    server.on('error', reject);
    serverExit.then(({ code, signal }) => {
      if (port === null) reject(new Error(`the server exited (code ${code}, signal ${signal}) before listening`));
    });
    setTimeout(() => reject(new Error('no "listening on" line within 30 s')), 30_000).unref();
  });
}

let BASE;
let PORT;
async function getText(path, timeoutMs = 5000) {
  const res = await fetch(BASE + path, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: res.status, body: await res.text() };
}
async function waitHealthy() {
  const deadline = Date.now() + 30_000;
  let last = '';
  while (Date.now() < deadline) {
    try {
      const r = await getText('/health', 2000);
      if (r.status === 200) return;
      last = `${r.status} ${r.body}`;
    } catch (e) { last = e.message; }
    await sleep(100);
  }
  throw new Error(`/health never answered 200 (last: ${last})`);
}

// ---- prompts ----
const WORDS = ('once upon a time there was a little girl named lily she liked to play in the park with her ' +
  'dog max one day they saw a big red ball under the tree the sun was warm and the birds sang happy ' +
  'mom said come home for lunch tom and sue went to the store to buy milk and bread the cat jumped ' +
  'over the fence because it wanted to find the bird a friendly bear lived near the river').split(' ');
const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');
// A long prefix many requests share (so the prefix cache and shared blocks are exercised): about
// 300 tokens of the model's vocabulary.
const SHARED_PREFIX = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. ' +
  'One day, she saw a big, red ball in the park. She ran to the ball and picked it up. Her friend Tom came ' +
  'to play with her. They threw the ball high in the sky and laughed. Then a little dog came and took the ' +
  'ball away. Lily and Tom ran after the dog. The dog was fast, but they did not give up. At last the dog ' +
  'stopped under a big tree and dropped the ball. Lily was happy. She gave the dog a hug and said, "Thank ' +
  'you, little dog." The dog wagged its tail. ';
const prompt = (shared) => (shared ? SHARED_PREFIX : '') + words(randint(1, shared ? 20 : 60));
// A long prompt: the shared prefix (~230 tokens) and up to 450 words (~1.9 tokens each), kept
// within the pool beside max_tokens <= 200, so a few of them at once force preemption.
function longPrompt() {
  const poolTokens = opts.poolBlocks * opts.blockSize;
  const maxWords = Math.min(450, Math.floor((poolTokens - 230 - 200 - 4 * opts.blockSize) / 2));
  return SHARED_PREFIX + words(randint(Math.min(200, Math.max(1, maxWords)), Math.max(1, maxWords)));
}

// ---- a request plan ----
// kind: 'stream' | 'full' | 'invalid'. For invalid ones, `expect` is the status that must come back.
function invalidPlan() {
  const cases = [
    ['/v1/completions', '{"model": "stories260K", "prompt": "Once upon', 400, 'bad JSON'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"}],', 400, 'bad JSON'],
    ['/v1/completions', '[1, 2, 3]', 400, 'not an object'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: 'ten' }, 400, 'max_tokens type', 'max_tokens'],
    ['/v1/completions', { model: MODEL, prompt: 42 }, 400, 'prompt type', 'prompt'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', temperature: 'hot' }, 400, 'temperature type', 'temperature'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', temperature: -1 }, 400, 'temperature range', 'temperature'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', n: 0 }, 400, 'n range', 'n'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', stream: 'yes' }, 400, 'stream type', 'stream'],
    ['/v1/completions', { model: MODEL, prompt: [1, 2, 100000] }, 400, 'token id range', 'prompt[2]'],
    ['/v1/chat/completions', { model: MODEL, messages: 'hi' }, 400, 'messages type', 'messages'],
    ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'wizard', content: 'hi' }] }, 400, 'role',
     'messages[0].role'],
    ['/v1/chat/completions', { model: MODEL }, 400, 'messages missing', 'messages'],
    ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], stream: true,
                               max_tokens: 1.5 }, 400, 'max_tokens float', 'max_tokens'],
    ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], kv: { policy: 'lru' } },
     400, 'kv.policy', 'kv.policy'],
    ['/v1/completions', { model: 'gpt-4o', prompt: 'hi' }, 404, 'unknown model', 'model'],
    ['/v1/chat/completions', { model: 'nope', messages: [{ role: 'user', content: 'hi' }], stream: true }, 404,
     'unknown model (stream)', 'model'],
    ['/v1/completions', { model: MODEL, prompt: Array.from({ length: 2100 }, (_, i) => 50 + (i % 400)) }, 400,
     'prompt over the context', 'prompt', 'context_length_exceeded'],
    ['/v1/nothing', { model: MODEL }, 404, 'unknown route'],
  ];
  // A max_tokens the context allows but the pool can never hold (only when the pool is the smaller).
  const overPool = opts.poolBlocks * opts.blockSize + opts.blockSize;
  if (overPool < 2000) {
    cases.push(['/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: overPool }, 400,
                'max_tokens over the pool', 'max_tokens', 'context_length_exceeded']);
  }
  const [path, body, expect, label, param, code] = pick(cases);
  return { kind: 'invalid', path, body: typeof body === 'string' ? body : JSON.stringify(body), expect, label,
           param, code };
}

function validPlan() {
  const chat = rand() < 0.5;
  const stream = rand() < 0.88;
  const shared = rand() < 0.3;
  const long = rand() < 0.06;
  const ignoreEos = rand() < 0.25;
  const n = !long && rand() < 0.05 ? randint(2, 3) : 1;
  const maxTokens = randint(8, 200);
  const body = { model: MODEL, max_tokens: maxTokens };
  const text = long ? longPrompt() : prompt(shared);
  if (chat) {
    body.messages = rand() < 0.3 ? [{ role: 'system', content: 'You are a storyteller.' }, { role: 'user', content: text }]
                                 : [{ role: 'user', content: text }];
  } else {
    body.prompt = text;
  }
  const t = rand();
  if (t < 0.3) body.temperature = 0;
  else if (t < 0.6) { body.temperature = 0.8; body.top_p = 0.95; }
  if (rand() < 0.3) body.seed = randint(0, 1 << 30);
  if (ignoreEos) body.ignore_eos = true;
  if (n > 1) body.n = n;
  if (rand() < 0.05) body.stop = ['.'];
  if (rand() < 0.06) {
    const policy = pick(['window', 'streaming', 'h2o', 'snapkv']);
    body.kv = { policy, budget: pick([48, 64, 96]) };
    if (policy === 'streaming') body.kv.sinks = 4;
  }
  const logprobs = rand() < 0.05 ? randint(0, 3) : -1;
  if (logprobs >= 0) {
    if (chat) { body.logprobs = true; body.top_logprobs = logprobs; } else body.logprobs = logprobs;
  }
  if (shared && rand() < 0.2) body.cache_salt = `salt-${randint(0, 3)}`;
  const includeUsage = stream && rand() < 0.7;
  if (stream) body.stream = true;
  if (includeUsage) body.stream_options = { include_usage: true };
  const cancelAfter = stream && rand() < 0.12 ? randint(1, 25) : 0;
  return { kind: stream ? 'stream' : 'full', chat, path: chat ? '/v1/chat/completions' : '/v1/completions',
           body: JSON.stringify(body), n, maxTokens, ignoreEos, includeUsage, cancelAfter,
           hasStop: !!body.stop, policy: body.kv?.policy ?? null, logprobs, long };
}

// A client that drops its TCP connection: after reading some bytes of a streamed answer, or in
// the middle of sending its request (the headers promise more body than comes).
function disconnectPlan() {
  const body = JSON.stringify({ model: MODEL, prompt: prompt(rand() < 0.5), max_tokens: randint(50, 200),
                                stream: true, ignore_eos: true });
  const half = rand() < 0.3;
  return { kind: 'disconnect', path: '/v1/completions', body, half, afterBytes: randint(1, 3000) };
}

// ---- the outcome of every request ----
const stats = {
  started: 0, completed: 0, completedStream: 0, completedFull: 0, errors4xxExpected: 0, rateLimited: 0,
  cancelled: 0, disconnected: 0, lost: 0, unexpected: 0, errors5xx: 0, inBandErrors: 0, long: 0,
  outputTokens: 0, outputTokensFromUsage: 0, chunks: 0, ttft: [], latency: [],
};
const errorsByKind = {};  // the invalid requests' labels and 429s, counted
const countError = (kind) => { errorsByKind[kind] = (errorsByKind[kind] ?? 0) + 1; };
const lostSamples = [];
const unexpectedSamples = [];
function lost(plan, why) {
  stats.lost++;
  if (lostSamples.length < 20) lostSamples.push({ why, path: plan.path, body: plan.body.slice(0, 300) });
  if (opts.verbose) console.error(`LOST ${why} ${plan.path} ${plan.body.slice(0, 200)}`);
}
function unexpected(plan, why) {
  stats.unexpected++;
  if (unexpectedSamples.length < 20) unexpectedSamples.push({ why, path: plan.path, body: plan.body.slice(0, 300) });
  if (opts.verbose) console.error(`UNEXPECTED ${why} ${plan.path} ${plan.body.slice(0, 200)}`);
}

// A JSON error object in OpenAI's shape.
function isErrorObject(v) {
  return v && typeof v === 'object' && v.error && typeof v.error === 'object' &&
         typeof v.error.message === 'string' && typeof v.error.type === 'string' &&
         'param' in v.error && 'code' in v.error;
}

class Cancelled extends Error {}

// Reads an SSE body: yields the data payload of each event. Throws on a malformed stream.
async function* sseEvents(body) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const part of body) {
    buf += decoder.decode(part, { stream: true });
    let sep;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      const data = [];
      for (const line of event.split('\n')) {
        if (line.startsWith('data: ')) data.push(line.slice(6));
        else if (line.startsWith('data:')) data.push(line.slice(5));
        else if (line === '' || line.startsWith(':')) continue;
        else throw new Error(`malformed SSE line ${JSON.stringify(line.slice(0, 120))}`);
      }
      if (data.length > 0) yield data.join('\n');
    }
  }
  buf += decoder.decode();
  if (buf.trim() !== '') throw new Error(`the stream ended inside an event: ${JSON.stringify(buf.slice(0, 120))}`);
}

async function runStream(plan, res, ac) {
  const ctype = res.headers.get('content-type') ?? '';
  if (!ctype.startsWith('text/event-stream')) throw new Error(`stream answered with content-type ${ctype}`);
  const object = plan.chat ? 'chat.completion.chunk' : 'text_completion';
  let id = null;
  let done = false;
  let usage = null;
  let contentChunks = 0;
  let firstContentAt = 0;
  let inBandError = null;
  const finish = new Array(plan.n).fill(null);
  const sawRole = new Array(plan.n).fill(false);
  for await (const data of sseEvents(res.body)) {
    if (done) throw new Error(`data after [DONE]: ${data.slice(0, 120)}`);
    if (data === '[DONE]') { done = true; continue; }
    let chunk;
    try { chunk = JSON.parse(data); } catch { throw new Error(`a chunk is not JSON: ${data.slice(0, 120)}`); }
    stats.chunks++;
    if (chunk.error !== undefined) {
      if (!isErrorObject(chunk)) throw new Error(`malformed in-band error ${data.slice(0, 200)}`);
      if (inBandError) throw new Error('two in-band errors');
      inBandError = chunk.error;
      continue;
    }
    if (inBandError) throw new Error('a chunk after the in-band error');
    if (chunk.object !== object) throw new Error(`chunk object ${chunk.object}, expected ${object}`);
    if (chunk.model !== MODEL) throw new Error(`chunk model ${chunk.model}`);
    if (id === null) id = chunk.id;
    if (chunk.id !== id || typeof id !== 'string') throw new Error(`chunk id ${chunk.id} after ${id}`);
    if (!Array.isArray(chunk.choices)) throw new Error('chunk without choices');
    if (chunk.choices.length === 0) {
      if (!plan.includeUsage) throw new Error('a chunk with no choices without include_usage');
      if (usage) throw new Error('two usage chunks');
      usage = chunk.usage;
      if (!usage || !Number.isInteger(usage.completion_tokens)) throw new Error(`bad usage chunk ${data.slice(0, 200)}`);
      continue;
    }
    if (usage) throw new Error('a choice chunk after the usage chunk');
    if (plan.includeUsage ? chunk.usage !== null : chunk.usage !== undefined) {
      throw new Error(`chunk usage ${JSON.stringify(chunk.usage)} (include_usage ${plan.includeUsage})`);
    }
    for (const c of chunk.choices) {
      const i = c.index;
      if (!Number.isInteger(i) || i < 0 || i >= plan.n) throw new Error(`choice index ${i}`);
      if (finish[i] !== null) throw new Error(`choice ${i} has a chunk after its finish_reason`);
      let text;
      if (plan.chat) {
        if (!c.delta || typeof c.delta !== 'object') throw new Error('chat chunk without delta');
        if (!sawRole[i]) {
          if (c.delta.role !== 'assistant') throw new Error(`choice ${i}'s first delta has role ${c.delta.role}`);
          sawRole[i] = true;
        } else if (c.delta.role !== undefined) throw new Error(`choice ${i} repeats the role`);
        text = c.delta.content;
        if (text !== undefined && typeof text !== 'string') throw new Error('delta.content not a string');
      } else {
        text = c.text;
        if (typeof text !== 'string') throw new Error('completion chunk text not a string');
      }
      checkLogprobs(plan, c.logprobs, !!text || c.logprobs != null, 1);
      if (text) {
        contentChunks++;
        if (!firstContentAt) firstContentAt = performance.now();
      }
      if (c.finish_reason !== null && c.finish_reason !== undefined) {
        if (!['stop', 'length'].includes(c.finish_reason)) throw new Error(`finish_reason ${c.finish_reason}`);
        finish[i] = c.finish_reason;
      }
    }
    if (plan.cancelAfter && contentChunks >= plan.cancelAfter && !done) {
      ac.abort(new Cancelled('intentional'));
      throw new Cancelled('intentional');
    }
  }
  if (!done) throw new Error('the stream ended without [DONE]');
  if (inBandError) return { error: inBandError };
  for (let i = 0; i < plan.n; i++) if (finish[i] === null) throw new Error(`choice ${i} never finished`);
  if (plan.includeUsage) {
    if (!usage) throw new Error('no usage chunk with include_usage');
    checkUsage(plan, usage, finish);
  }
  return { contentChunks, usage, firstContentAt, finish };
}

// A choice's logprobs: null unless asked; when asked, `tokens` entries (one per streamed chunk),
// each with `plan.logprobs` alternatives and log-probabilities <= 0.
function checkLogprobs(plan, lp, expectSome, tokens) {
  if (plan.logprobs < 0) {
    if (lp != null) throw new Error(`logprobs ${JSON.stringify(lp).slice(0, 100)} without asking`);
    return;
  }
  if (lp == null) {
    if (expectSome) throw new Error('no logprobs on a token chunk though asked');
    return;
  }
  const ok = (x) => typeof x === 'number' && x <= 1e-9 && x > -1e4;
  if (plan.chat) {
    if (!Array.isArray(lp.content)) throw new Error(`chat logprobs without content[] ${JSON.stringify(lp).slice(0, 100)}`);
    if (tokens !== null && lp.content.length !== tokens) throw new Error(`${lp.content.length} logprob entries`);
    for (const e of lp.content) {
      if (typeof e.token !== 'string' || !ok(e.logprob) || !Array.isArray(e.bytes) ||
          !Array.isArray(e.top_logprobs) || e.top_logprobs.length !== plan.logprobs ||
          !e.top_logprobs.every((t) => ok(t.logprob))) {
        throw new Error(`bad chat logprob entry ${JSON.stringify(e).slice(0, 200)}`);
      }
    }
  } else {
    const n = lp.tokens?.length;
    if (!Array.isArray(lp.tokens) || !Array.isArray(lp.token_logprobs) || !Array.isArray(lp.top_logprobs) ||
        !Array.isArray(lp.text_offset) || lp.token_logprobs.length !== n || lp.text_offset.length !== n ||
        (tokens !== null && n !== tokens)) {
      throw new Error(`bad completion logprobs ${JSON.stringify(lp).slice(0, 200)}`);
    }
    for (let i = 0; i < n; i++) {
      const top = lp.top_logprobs[i];
      if (!ok(lp.token_logprobs[i]) || top === null || typeof top !== 'object' ||
          Object.keys(top).length > plan.logprobs || !Object.values(top).every(ok)) {
        throw new Error(`bad completion logprob ${i}: ${JSON.stringify(lp).slice(0, 200)}`);
      }
    }
  }
}

function checkUsage(plan, u, finish) {
  if (!(u.prompt_tokens > 0)) throw new Error(`usage.prompt_tokens ${u.prompt_tokens}`);
  if (u.total_tokens !== u.prompt_tokens + u.completion_tokens) throw new Error(`usage total ${JSON.stringify(u)}`);
  if (!(u.completion_tokens >= 0) || u.completion_tokens > plan.n * plan.maxTokens) {
    throw new Error(`usage.completion_tokens ${u.completion_tokens} for n ${plan.n} max_tokens ${plan.maxTokens}`);
  }
  if (finish.every((f) => f === 'length') && u.completion_tokens !== plan.n * plan.maxTokens) {
    throw new Error(`finish length but completion_tokens ${u.completion_tokens} != ${plan.n} x ${plan.maxTokens}`);
  }
  if (plan.ignoreEos && !plan.hasStop && !plan.chat && finish.some((f) => f !== 'length')) {
    throw new Error(`ignore_eos completion finished with ${JSON.stringify(finish)}`);
  }
}

async function runFull(plan, res) {
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch { throw new Error(`the body is not JSON: ${text.slice(0, 120)}`); }
  if (body.error !== undefined) {
    if (!isErrorObject(body)) throw new Error(`malformed error body ${text.slice(0, 200)}`);
    return { error: body.error };  // an error after the 200 went out
  }
  const object = plan.chat ? 'chat.completion' : 'text_completion';
  if (body.object !== object) throw new Error(`object ${body.object}`);
  if (!Array.isArray(body.choices) || body.choices.length !== plan.n) throw new Error(`choices ${text.slice(0, 200)}`);
  const finish = body.choices.map((c) => c.finish_reason);
  for (const c of body.choices) {
    if (!['stop', 'length'].includes(c.finish_reason)) throw new Error(`finish_reason ${c.finish_reason}`);
    const t = plan.chat ? c.message?.content : c.text;
    if (typeof t !== 'string') throw new Error('no text in a choice');
    if (plan.chat && c.message.role !== 'assistant') throw new Error(`message role ${c.message.role}`);
    checkLogprobs(plan, c.logprobs, false, null);
    if (plan.logprobs >= 0 && t.length > 0 && c.logprobs == null) throw new Error('no logprobs though asked');
  }
  checkUsage(plan, body.usage, finish);
  return { usage: body.usage, finish };
}

async function oneRequest(plan) {
  inFlight.add(plan);
  try {
    return await answer(plan);
  } finally {
    inFlight.delete(plan);
  }
}

async function answer(plan) {
  stats.started++;
  if (plan.kind === 'disconnect') return answerDisconnect(plan);
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new Error('client timeout')), opts.requestTimeout * 1000);
  const t0 = performance.now();
  let res;
  try {
    res = await fetch(BASE + plan.path, { method: 'POST', headers: { 'content-type': 'application/json' },
                                          body: plan.body, signal: ac.signal });
  } catch (e) {
    clearTimeout(timer);
    lost(plan, `fetch failed: ${e.cause?.code ?? ''} ${e.cause?.message ?? e.message}`);
    return 0;
  }
  try {
    if (res.status === 429) {
      const text = await res.text();
      const retry = Number(res.headers.get('retry-after'));
      if (!isErrorObject(safeParse(text)) || !(retry >= 0)) {
        lost(plan, `429 without an error object or Retry-After: ${text.slice(0, 120)}`);
        return 0;
      }
      stats.rateLimited++;
      countError('429 busy');
      return Math.min(retry, 2) * 1000;
    }
    if (res.status !== 200) {
      const text = await res.text();
      const body = safeParse(text);
      if (!isErrorObject(body)) {
        lost(plan, `HTTP ${res.status} without an error object: ${text.slice(0, 120)}`);
        return 0;
      }
      if (res.status >= 500) stats.errors5xx++;
      if (plan.kind !== 'invalid') {
        unexpected(plan, `valid request answered ${res.status} ${text.slice(0, 200)}`);
      } else if (res.status !== plan.expect || (plan.param && body.error.param !== plan.param) ||
                 (plan.code && body.error.code !== plan.code)) {
        unexpected(plan, `${plan.label}: expected ${plan.expect} param ${plan.param} code ${plan.code}, got ` +
                         `${res.status} ${text.slice(0, 200)}`);
      } else {
        stats.errors4xxExpected++;
        countError(`${plan.expect} ${plan.label}`);
      }
      return 0;
    }
    if (plan.kind === 'invalid') {
      await res.text().catch(() => {});
      unexpected(plan, `${plan.label}: expected ${plan.expect}, got 200`);
      return 0;
    }
    const r = plan.kind === 'stream' ? await runStream(plan, res, ac) : await runFull(plan, res);
    if (r.error) {
      stats.inBandErrors++;
      unexpected(plan, `in-band error: ${JSON.stringify(r.error).slice(0, 200)}`);
      return 0;
    }
    stats.completed++;
    if (plan.long) stats.long++;
    if (plan.kind === 'stream') {
      stats.completedStream++;
      if (r.firstContentAt) stats.ttft.push(r.firstContentAt - t0);
    } else {
      stats.completedFull++;
    }
    stats.latency.push(performance.now() - t0);
    if (r.usage) {
      stats.outputTokens += r.usage.completion_tokens;
      stats.outputTokensFromUsage += r.usage.completion_tokens;
    } else {
      stats.outputTokens += r.contentChunks;
    }
    return 0;
  } catch (e) {
    if (e instanceof Cancelled || ac.signal.reason instanceof Cancelled) {
      stats.cancelled++;
      return 0;
    }
    lost(plan, e.name === 'AbortError' || ac.signal.aborted ? `no end within ${opts.requestTimeout} s`
                                                          : `${e.cause?.code ?? ''} ${e.message}`);
    return 0;
  } finally {
    clearTimeout(timer);
  }
}
function safeParse(t) { try { return JSON.parse(t); } catch { return null; } }

// A raw socket: the request (whole, or cut off halfway through its body), then the connection
// dropped once `afterBytes` of the answer came. The answer must have begun with 200 (or 429 when
// the server is full); a half-sent request may get nothing.
function answerDisconnect(plan) {
  return new Promise((resolve) => {
    const sock = connect(PORT, '127.0.0.1');
    let head = '';
    let got = 0;
    let settled = false;
    const finish = (why) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      const status = head.match(/^HTTP\/1\.1 (\d{3})/)?.[1];
      if (why === 'timeout') lost(plan, `raw socket: no ${got ? 'more bytes' : 'answer'} within ${opts.requestTimeout} s`);
      else if (why.startsWith('error') && !plan.half) lost(plan, `raw socket ${why}`);
      else if (!plan.half && status !== '200' && status !== '429') {
        unexpected(plan, `raw socket: answered ${JSON.stringify(head.slice(0, 80))} (${why})`);
      } else {
        stats.disconnected++;
      }
      resolve(0);
    };
    const timer = setTimeout(() => finish('timeout'), opts.requestTimeout * 1000);
    sock.on('connect', () => {
      const len = Buffer.byteLength(plan.body);
      const request = `POST ${plan.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
                      `Content-Length: ${len}\r\n\r\n`;
      if (plan.half) {
        sock.write(request + plan.body.slice(0, Math.floor(len / 2)), () => setTimeout(() => finish('half'), randint(0, 100)));
      } else {
        sock.write(request + plan.body);
      }
    });
    sock.on('data', (d) => {
      if (head.length < 64) head += d.toString('latin1', 0, Math.min(d.length, 64));
      got += d.length;
      if (got >= plan.afterBytes) finish('dropped');
    });
    sock.on('end', () => finish(got > 0 ? 'ended' : 'error: closed with no answer'));
    sock.on('error', (e) => finish(`error ${e.code ?? e.message}`));
  });
}

// ---- the server's resident memory (the soak's leak check) ----
const rssSamples = [];  // { t: seconds into the load, kb }
function readRssKb() {
  try {
    const m = readFileSync(`/proc/${server.pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
    return m ? Number(m[1]) : null;
  } catch { return null; }
}
const median = (xs) => (xs.length === 0 ? null : [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]);
// Baseline: the median over the minute after the warm-up; final: the median of the last five
// samples under load. Medians, so one sample taken mid-burst does not decide.
function rssCheck(seconds) {
  const warmup = opts.warmup ?? Math.round(Math.min(300, seconds / 5));
  const span = Math.max(30, Math.min(60, seconds / 10));
  const base = median(rssSamples.filter((s) => s.t >= warmup && s.t < warmup + span).map((s) => s.kb));
  const final = median(rssSamples.slice(-5).map((s) => s.kb));
  const peak = Math.max(...rssSamples.filter((s) => s.t >= warmup).map((s) => s.kb));
  const first = rssSamples[0]?.kb ?? null;
  const growth = base && final ? (100 * (final - base)) / base : null;
  const mb = (kb) => (kb === null ? null : Number((kb / 1024).toFixed(1)));
  const report = { samples: rssSamples.length, warmup_s: warmup, start_mb: mb(first), after_warmup_mb: mb(base),
                   final_mb: mb(final), peak_after_warmup_mb: Number.isFinite(peak) ? mb(peak) : null,
                   growth_pct: growth === null ? null : Number(growth.toFixed(2)) };
  if (opts.rssGrowthLimit === null) return { report, check: null };
  const ok = growth !== null && growth < opts.rssGrowthLimit;
  return { report, check: { name: `RSS grows < ${opts.rssGrowthLimit}% after the ${warmup} s warm-up`, ok,
                            detail: growth === null ? 'too few samples (the run is shorter than the warm-up + a minute?)'
                                                    : `${report.after_warmup_mb} -> ${report.final_mb} MB, ${report.growth_pct}%` } };
}

// ---- metrics ----
function metricValue(text, name, labelFilter) {
  let sum = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !line.startsWith(name)) continue;
    const m = line.match(/^([^\s{]+)(\{[^}]*\})?\s+(\S+)/);
    if (!m || m[1] !== name) continue;
    if (labelFilter && !(m[2] ?? '').includes(labelFilter)) continue;
    sum = (sum ?? 0) + Number(m[3]);
  }
  return sum;
}
async function postChecks() {
  const checks = [];
  const health = await getText('/health').catch((e) => ({ status: 0, body: e.message }));
  checks.push({ name: 'GET /health is 200', ok: health.status === 200, detail: `${health.status} ${health.body}` });
  // It still generates: 8 greedy tokens, ignoring EOS.
  const gen = await fetch(BASE + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: AbortSignal.timeout(20_000),
    body: JSON.stringify({ model: MODEL, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, ignore_eos: true }),
  }).then(async (r) => ({ status: r.status, body: safeParse(await r.text()) })).catch((e) => ({ status: 0, error: e.message }));
  checks.push({ name: 'a completion after the load returns its 8 tokens',
                ok: gen.status === 200 && gen.body?.usage?.completion_tokens === 8,
                detail: gen.status === 200 ? `completion_tokens ${gen.body?.usage?.completion_tokens}`
                                           : `${gen.status} ${gen.error ?? JSON.stringify(gen.body).slice(0, 120)}` });
  let used = null;
  let running = null;
  let waiting = null;
  let metricsText = '';
  const deadline = Date.now() + 3000;
  while (true) {
    const m = await getText('/metrics').catch(() => ({ status: 0, body: '' }));
    metricsText = m.body;
    used = metricValue(m.body, 'kvlm:kv_cache_blocks', 'state="used"');
    running = metricValue(m.body, 'kvlm:num_requests_running');
    waiting = metricValue(m.body, 'kvlm:num_requests_waiting');
    if ((used === 0 && running === 0 && (waiting ?? 0) === 0) || Date.now() > deadline) break;
    await sleep(200);
  }
  checks.push({ name: 'kv_cache_blocks{state="used"} is 0', ok: used === 0, detail: `${used}` });
  checks.push({ name: 'num_requests_running is 0', ok: running === 0, detail: `${running}` });
  if (waiting !== null) checks.push({ name: 'num_requests_waiting is 0', ok: waiting === 0, detail: `${waiting}` });
  const server = {
    preemptions: metricValue(metricsText, 'kvlm:num_preemptions_total') ?? metricValue(metricsText, 'kvlm:num_preemptions'),
    prefix_hits: metricValue(metricsText, 'kvlm:prefix_cache_hits_total') ?? metricValue(metricsText, 'kvlm:prefix_cache_hits'),
    prefix_queries: metricValue(metricsText, 'kvlm:prefix_cache_queries_total') ??
                    metricValue(metricsText, 'kvlm:prefix_cache_queries'),
    generation_tokens: metricValue(metricsText, 'kvlm:generation_tokens_total') ??
                       metricValue(metricsText, 'kvlm:generation_tokens'),
  };
  return { checks, server, metricsText };
}

async function stopServer() {
  if (serverGone) {
    return { name: 'SIGTERM: the server exits 0', ok: false,
             detail: `it had already exited during the run: code ${serverGone.code} signal ${serverGone.signal}` };
  }
  stopping = true;
  server.kill('SIGTERM');
  const r = await Promise.race([serverExit, sleep(20_000).then(() => null)]);
  if (r === null) {
    server.kill('SIGKILL');
    await serverExit;
    return { name: 'SIGTERM: the server exits 0', ok: false, detail: 'no exit within 20 s; killed' };
  }
  return { name: 'SIGTERM: the server exits 0', ok: r.code === 0, detail: `code ${r.code} signal ${r.signal}` };
}

const pct = (xs, p) => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

// ---- main ----
async function main() {
  const port = await startServer();
  PORT = port;
  BASE = `http://127.0.0.1:${port}`;
  await waitHealthy();
  info(`load-test: ${opts.clients} clients for ${opts.seconds} s against ${BASE} (seed ${opts.seed})`);
  const t0 = performance.now();
  const endAt = t0 + opts.seconds * 1000;
  let progress = null;
  if (!opts.json) {
    progress = setInterval(() => {
      const el = (performance.now() - t0) / 1000;
      const rss = rssSamples.at(-1)?.kb;
      info(`  ${el.toFixed(0)} s: ${stats.started} started, ${stats.completed} completed, ${stats.cancelled} ` +
           `cancelled, ${stats.disconnected} dropped, ${stats.errors4xxExpected} 4xx, ${stats.rateLimited} 429, ` +
           `${stats.lost} lost, ${stats.unexpected} unexpected, RSS ${rss ? (rss / 1024).toFixed(1) : '?'} MB`);
    }, 10_000);
  }
  const sampler = setInterval(() => {
    const kb = readRssKb();
    if (kb !== null) rssSamples.push({ t: (performance.now() - t0) / 1000, kb });
  }, 5_000);
  const loops = Array.from({ length: opts.clients }, async () => {
    while (performance.now() < endAt && !serverGone) {
      const r = rand();
      const plan = r < 0.05 ? invalidPlan() : r < 0.08 ? disconnectPlan() : validPlan();
      const lostBefore = stats.lost;
      const wait = await oneRequest(plan);
      if (wait > 0) await sleep(wait);
      else if (stats.lost > lostBefore) await sleep(50);  // no busy loop against a broken server
    }
  });
  await Promise.all(loops);
  clearInterval(progress);
  clearInterval(sampler);
  const elapsed = (performance.now() - t0) / 1000;
  const rss = rssCheck(elapsed);
  if (serverGone) {
    info(`load-test: the server exited during the run (code ${serverGone.code}, signal ${serverGone.signal})`);
  }
  const post = await postChecks();
  const stop = await stopServer();
  const checks = [...post.checks, ...(rss.check ? [rss.check] : []), stop];
  const ok = stats.lost === 0 && stats.unexpected === 0 && checks.every((c) => c.ok);
  const finished = stats.completed + stats.errors4xxExpected + stats.rateLimited + stats.cancelled +
                   stats.disconnected + stats.lost + stats.unexpected;
  const summary = {
    ok,
    seed: opts.seed,
    seconds: Number(elapsed.toFixed(2)),
    clients: opts.clients,
    server_flags: { pool_blocks: opts.poolBlocks, block_size: opts.blockSize, max_seqs: opts.maxSeqs,
                    max_queue: opts.maxQueue, extra: opts.serverArgs },
    requests: stats.started,
    requests_per_s: Number((stats.started / elapsed).toFixed(2)),
    completed: stats.completed,
    completed_stream: stats.completedStream,
    completed_full: stats.completedFull,
    errors_expected_4xx: stats.errors4xxExpected,
    rate_limited_429: stats.rateLimited,
    cancelled: stats.cancelled,
    disconnected: stats.disconnected,
    completed_long_prompt: stats.long,
    errors_by_kind: errorsByKind,
    lost: stats.lost,
    unexpected: stats.unexpected,
    errors_5xx: stats.errors5xx,
    in_band_errors: stats.inBandErrors,
    accounted: finished === stats.started,
    ttft_ms: { p50: round(pct(stats.ttft, 50)), p90: round(pct(stats.ttft, 90)), p99: round(pct(stats.ttft, 99)),
               n: stats.ttft.length },
    latency_ms: { p50: round(pct(stats.latency, 50)), p90: round(pct(stats.latency, 90)),
                  p99: round(pct(stats.latency, 99)), max: round(pct(stats.latency, 100)) },
    rss: rss.report,
    output_tokens: stats.outputTokens,
    output_tokens_per_s: Number((stats.outputTokens / elapsed).toFixed(1)),
    output_tokens_from_usage: stats.outputTokensFromUsage,
    server_metrics: post.server,
    checks,
    lost_samples: lostSamples,
    in_flight_when_the_server_died: inFlightAtExit,
    unexpected_samples: unexpectedSamples,
  };
  if (!summary.accounted) summary.ok = false;
  return summary;
}
const round = (x) => (x === null ? null : Number(x.toFixed(1)));

function printSummary(s) {
  const lines = [
    `kvlm load test: ${s.clients} clients, ${s.seconds} s, seed ${s.seed}, pool ${s.server_flags.pool_blocks} blocks ` +
    `x ${s.server_flags.block_size}, max-seqs ${s.server_flags.max_seqs}, max-queue ${s.server_flags.max_queue}`,
    `  requests      ${s.requests} (${s.requests_per_s}/s)`,
    `  completed     ${s.completed} (${s.completed_stream} streamed, ${s.completed_full} whole)`,
    `  errors (4xx)  ${s.errors_expected_4xx} expected, from invalid requests`,
    `  429           ${s.rate_limited_429}`,
    `  cancelled     ${s.cancelled}, dropped at the socket ${s.disconnected}`,
    `  long prompts  ${s.completed_long_prompt} completed`,
    `  errors        ${Object.entries(s.errors_by_kind).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k}: ${v}`).join(', ') || 'none'}`,
    `  lost          ${s.lost}`,
    `  unexpected    ${s.unexpected} (5xx ${s.errors_5xx}, in-band errors ${s.in_band_errors})`,
    `  TTFT          p50 ${s.ttft_ms.p50} ms, p90 ${s.ttft_ms.p90} ms, p99 ${s.ttft_ms.p99} ms (${s.ttft_ms.n} streams)`,
    `  latency       p50 ${s.latency_ms.p50} ms, p90 ${s.latency_ms.p90} ms, p99 ${s.latency_ms.p99} ms, max ${s.latency_ms.max} ms`,
    `  RSS           ${s.rss.start_mb} MB at start, ${s.rss.after_warmup_mb} MB after the ${s.rss.warmup_s} s warm-up, ` +
    `${s.rss.final_mb} MB at the end (${s.rss.growth_pct}%), peak ${s.rss.peak_after_warmup_mb} MB (${s.rss.samples} samples)`,
    `  output        ${s.output_tokens} tokens, ${s.output_tokens_per_s} tokens/s`,
    `  server        ${JSON.stringify(s.server_metrics)}`,
  ];
  for (const c of s.checks) lines.push(`  ${c.ok ? 'ok  ' : 'FAIL'}  ${c.name} (${c.detail})`);
  if (!s.accounted) lines.push('  FAIL  some requests ended in no category');
  if (s.in_flight_when_the_server_died) {
    lines.push(`  the server died with ${s.in_flight_when_the_server_died.length} requests in flight:`);
    for (const r of s.in_flight_when_the_server_died) lines.push(`    ${r}`);
  }
  for (const l of s.lost_samples) lines.push(`  lost: ${l.why} — POST ${l.path} ${l.body}`);
  for (const u of s.unexpected_samples) lines.push(`  unexpected: ${u.why} — POST ${u.path} ${u.body}`);
  const used = s.checks.find((c) => c.name.startsWith('kv_cache_blocks'))?.detail ?? '?';
  lines.push(`${s.ok ? 'PASS' : 'FAIL'}: ${s.requests} requests in ${s.seconds} s (${s.completed} completed, ` +
             `${s.cancelled + s.disconnected} cancelled or dropped, ${s.errors_expected_4xx + s.rate_limited_429} ` +
             `refused as expected), ${s.lost} lost, ${s.unexpected} unexpected, ${used} blocks held after, ` +
             `${s.server_metrics.preemptions} preemptions, RSS ${s.rss.growth_pct ?? '?'}% after warm-up, ` +
             `latency p50/p99 ${s.latency_ms.p50}/${s.latency_ms.p99} ms`);
  console.log(lines.join('\n'));
}

const hardLimit = setTimeout(() => {
  console.error('load-test: the run exceeded its hard time limit; killing the server');
  server?.kill('SIGKILL');
  process.exit(1);
}, (opts.seconds + opts.requestTimeout + 90) * 1000);
hardLimit.unref();

let summary;
try {
  summary = await main();
} catch (e) {
  console.error(`load-test: ${e.stack ?? e}`);
  server?.kill('SIGKILL');
  console.error(serverLog.slice(-40).join('\n'));
  process.exit(1);
}
if (opts.json) console.log(JSON.stringify(summary, null, 2));
else printSummary(summary);
if (!summary.ok) console.error(`--- last lines of the server's log ---\n${serverLog.slice(-30).join('\n')}`);
process.exit(summary.ok ? 0 : 1);
