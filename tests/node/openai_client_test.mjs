// Drives `kvlm serve` (the embedded stories260K model) through the official `openai` npm client:
// streaming chat, usage in streams, a plain completion, typed errors and the model list.
//
//   node tests/node/openai_client_test.mjs /path/to/kvlm
//
// Exit 0: every check passed; 1: a check failed (the reason is printed); 77: the `openai` package
// is not installed (CTest's SKIP_RETURN_CODE).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

const API_KEY = 'sk-kvlm-test';
const MODEL = 'stories260K';
const TOTAL_BUDGET_MS = 55_000;   // the whole test, server start to exit
const STARTUP_MS = 20_000;        // listening line + /health 200
const REQUEST_MS = 15_000;        // any one SDK call
const EXIT_MS = 10_000;           // SIGTERM to exit

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  console.log(`SKIP: the openai package is not installed (${e.code ?? e.message}); run npm ci in tests/node`);
  process.exit(77);
}

const binary = process.argv[2];
if (!binary || !existsSync(binary)) {
  console.error(`usage: node openai_client_test.mjs /path/to/kvlm (got ${binary ?? 'nothing'})`);
  process.exit(1);
}

let server = null;
let serverLog = [];   // the last lines of the server's output, shown on failure
let serverExit = null;  // resolves to {code, signal}
let failures = 0;

function startServer() {
  return new Promise((resolve, reject) => {
    const args = ['serve', '--port', '0', '--host', '127.0.0.1', '--api-key', API_KEY, '--threads', '2',
                  '--shutdown-timeout', '5'];
    server = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    serverExit = new Promise((done) => server.on('exit', (code, signal) => done({ code, signal })));
    let port = null;
    let pending = '';
    const onData = (data) => {
      pending += data.toString();
      const lines = pending.split('\n');
      pending = lines.pop();
      for (const line of lines) {
        serverLog.push(line);
        if (serverLog.length > 200) serverLog.shift();
        const m = port === null && line.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
        if (m) {
          port = Number(m[1]);
          resolve(port);
        }
      }
    };
    server.stdout.on('data', onData);
    server.stderr.on('data', onData);
    server.on('error', reject);
    serverExit.then(({ code, signal }) => {
      if (port === null) reject(new Error(`the server exited (code ${code}, signal ${signal}) before listening`));
    });
    setTimeout(() => reject(new Error(`no 'listening on' line within ${STARTUP_MS} ms`)), STARTUP_MS).unref();
  });
}

async function waitHealthy(port) {
  const deadline = Date.now() + STARTUP_MS;
  let last = '';
  while (Date.now() < deadline) {
    try {
      const res = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) });
      const body = await res.text();
      if (res.status === 200) {
        assert.deepEqual(JSON.parse(body), { status: 'ok' });
        return;
      }
      last = `${res.status} ${body}`;
    } catch (e) {
      last = e.message;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`/health never answered 200 (last: ${last})`);
}

async function check(name, fn) {
  try {
    const detail = await fn();
    console.log(`ok   ${name}${detail ? ` — ${detail}` : ''}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}

// Runs `fn` and returns the error it throws; fails when it does not throw.
async function thrown(fn) {
  try {
    const value = await fn();
    throw new assert.AssertionError({ message: `expected an error, got ${JSON.stringify(value).slice(0, 300)}` });
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    return e;
  }
}

function describe(e) {
  return `${e?.constructor?.name} status=${e?.status} code=${e?.code} param=${e?.param} message=${e?.message}`;
}

const ENGLISH = /\b(the|a|and|was|to|he|she|it|they|of|in|with|her|his|said|day|one|little)\b/i;

async function main() {
  const port = await startServer();
  await waitHealthy(port);
  console.log(`ok   server up on port ${port}`);
  const baseURL = `http://127.0.0.1:${port}/v1`;
  const client = new OpenAI({ baseURL, apiKey: API_KEY, maxRetries: 0, timeout: REQUEST_MS });

  await check('(a) streaming chat: chunks, one id, role first, content, one finish_reason', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'system', content: 'You tell short stories.' },
                 { role: 'user', content: 'Tell me a story about a cat.' }],
      stream: true, max_tokens: 32, temperature: 0,
    });
    let id = null;
    let n = 0;
    let content = '';
    let finishes = [];
    let sawRoleFirst = false;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      assert.equal(chunk.model, MODEL);
      assert.ok(typeof chunk.id === 'string' && chunk.id.length > 0, 'the chunk has an id');
      if (id === null) id = chunk.id;
      assert.equal(chunk.id, id, 'every chunk carries the same id');
      assert.equal(chunk.choices.length, 1, 'one choice per chunk');
      const choice = chunk.choices[0];
      assert.equal(choice.index, 0);
      if (n === 0) {
        assert.equal(choice.delta.role, 'assistant', 'the first delta carries the role');
        sawRoleFirst = true;
      } else {
        assert.equal(choice.delta.role, undefined, 'only the first delta carries the role');
      }
      assert.equal(finishes.length, 0, 'no chunk after the finish_reason');
      if (typeof choice.delta.content === 'string') content += choice.delta.content;
      if (choice.finish_reason != null) finishes.push(choice.finish_reason);
      n++;
    }
    assert.ok(sawRoleFirst);
    assert.ok(content.length > 0, 'the content is not empty');
    assert.equal(finishes.length, 1, `exactly one finish_reason (got ${JSON.stringify(finishes)})`);
    assert.ok(['stop', 'length'].includes(finishes[0]), `finish_reason ${finishes[0]}`);
    return `${n} chunks, finish ${finishes[0]}, ${JSON.stringify(content.slice(0, 60))}`;
  });

  await check('(b) stream_options.include_usage: last chunk has choices [] and usage', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }],
      stream: true, stream_options: { include_usage: true }, max_tokens: 16, temperature: 0,
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.ok(chunks.length >= 3, `role, content and usage chunks (got ${chunks.length})`);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, [], 'the usage chunk has no choices');
    const u = last.usage;
    assert.ok(u, 'the last chunk has usage');
    assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `prompt_tokens ${u.prompt_tokens}`);
    assert.ok(Number.isInteger(u.completion_tokens) && u.completion_tokens >= 1 && u.completion_tokens <= 16,
              `completion_tokens ${u.completion_tokens}`);
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    for (const c of chunks.slice(0, -1)) {
      assert.equal(c.usage, null, 'the other chunks carry usage: null');
      assert.equal(c.choices.length, 1);
    }
    const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason != null);
    assert.equal(finishes.length, 1, 'exactly one finish_reason');
    if (finishes[0].finish_reason === 'length') assert.equal(u.completion_tokens, 16);
    return `usage ${JSON.stringify({ p: u.prompt_tokens, c: u.completion_tokens, t: u.total_tokens })}`;
  });

  await check('(c) completion: English text, usage consistent', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 20,
                                                temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.model, MODEL);
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.ok(typeof c.text === 'string' && c.text.length > 0, 'non-empty text');
    assert.match(c.text, ENGLISH, 'the text holds English words');
    assert.ok(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
    const u = r.usage;
    assert.ok(u.prompt_tokens > 0);
    assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 20, `completion_tokens ${u.completion_tokens}`);
    if (c.finish_reason === 'length') assert.equal(u.completion_tokens, 20);
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    // The same prompt's token count through /tokenize (BOS included when the model adds one).
    const tok = await fetch(`http://127.0.0.1:${port}/tokenize`, {
      method: 'POST', headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ content: 'Once upon a time', add_special: true }),
    });
    assert.equal(tok.status, 200);
    const { tokens } = await tok.json();
    assert.equal(u.prompt_tokens, tokens.length, 'usage.prompt_tokens matches /tokenize');
    // temperature 0 is deterministic.
    const again = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 20,
                                                    temperature: 0 });
    assert.equal(again.choices[0].text, c.text, 'temperature 0 repeats itself');
    return `${u.prompt_tokens}+${u.completion_tokens} tokens, ${JSON.stringify(c.text.slice(0, 60))}`;
  });

  await check('(d) wrong API key → AuthenticationError 401', async () => {
    const bad = new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0, timeout: REQUEST_MS });
    const e = await thrown(() => bad.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 4 }));
    assert.ok(e instanceof OpenAI.AuthenticationError, describe(e));
    assert.equal(e.status, 401);
    assert.equal(e.error?.type, 'authentication_error');
    const e2 = await thrown(() => bad.models.list());
    assert.ok(e2 instanceof OpenAI.AuthenticationError, `models.list: ${describe(e2)}`);
    return e.message;
  });

  await check('(d) unknown model → NotFoundError 404', async () => {
    const e = await thrown(() => client.chat.completions.create({
      model: 'gpt-nonexistent', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }));
    assert.ok(e instanceof OpenAI.NotFoundError, describe(e));
    assert.equal(e.status, 404);
    assert.equal(e.param, 'model');
    assert.equal(e.code, 'model_not_found');
    return e.message;
  });

  for (const [label, temperature] of [['\'hot\'', 'hot'], ['-1', -1]]) {
    await check(`(d) temperature ${label} → BadRequestError 400 naming 'temperature'`, async () => {
      const e = await thrown(() => client.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature }));
      assert.ok(e instanceof OpenAI.BadRequestError, describe(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, 'temperature');
      assert.equal(e.error?.param, 'temperature');
      assert.equal(e.type, 'invalid_request_error');
      assert.match(e.error?.message ?? '', /temperature/);
      return e.message;
    });
  }

  await check('(d) streaming request with a bad field → BadRequestError before any chunk', async () => {
    const e = await thrown(async () => {
      const s = await client.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 'ten', stream: true });
      for await (const _ of s) { /* should not get here */ }
    });
    assert.ok(e instanceof OpenAI.BadRequestError, describe(e));
    assert.equal(e.param, 'max_tokens');
    return e.message;
  });

  await check('(d) 3000-token prompt → BadRequestError context_length_exceeded', async () => {
    const prompt = Array.from({ length: 3000 }, (_, i) => 100 + (i % 300));
    const e = await thrown(() => client.completions.create({ model: MODEL, prompt, max_tokens: 4 }));
    assert.ok(e instanceof OpenAI.BadRequestError, describe(e));
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'prompt');
    return e.message;
  });

  await check('(d) huge chat message → BadRequestError context_length_exceeded', async () => {
    const content = 'the little dog ran to the park and played. '.repeat(400);  // ~17k characters
    const e = await thrown(() => client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content }], max_tokens: 4, stream: true }));
    assert.ok(e instanceof OpenAI.BadRequestError, describe(e));
    assert.equal(e.code, 'context_length_exceeded');
    return e.message;
  });

  await check('(d) max_tokens past the context → BadRequestError context_length_exceeded', async () => {
    const e = await thrown(() => client.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 5000 }));
    assert.ok(e instanceof OpenAI.BadRequestError, describe(e));
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'max_tokens');
    return e.message;
  });

  await check('(e) models.list() lists the model', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids, [MODEL]);
    return `ids ${JSON.stringify(ids)}`;
  });

  await check('(e) a completion stream through the SDK ends with [DONE]', async () => {
    const stream = await client.completions.create({ model: MODEL, prompt: 'The dog', max_tokens: 12,
                                                    temperature: 0, stream: true });
    let text = '';
    let finishes = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      text += chunk.choices[0]?.text ?? '';
      if (chunk.choices[0]?.finish_reason != null) finishes++;
    }
    assert.equal(finishes, 1);
    assert.ok(text.length > 0);
    return JSON.stringify(text.slice(0, 60));
  });
}

async function stopServer() {
  if (!server || server.exitCode !== null || server.signalCode !== null) {
    const r = server ? await serverExit : null;
    return r;
  }
  server.kill('SIGTERM');
  const timer = new Promise((r) => setTimeout(() => r(null), EXIT_MS));
  const r = await Promise.race([serverExit, timer]);
  if (r === null) {
    server.kill('SIGKILL');
    await serverExit;
    return { code: null, signal: 'SIGKILL (no exit within the timeout after SIGTERM)' };
  }
  return r;
}

const watchdog = setTimeout(async () => {
  console.log(`FAIL the test ran past ${TOTAL_BUDGET_MS} ms`);
  server?.kill('SIGKILL');
  process.exit(1);
}, TOTAL_BUDGET_MS);

try {
  await main();
} catch (e) {
  failures++;
  console.log(`FAIL setup: ${e.stack ?? e}`);
}
const exit = await stopServer();
if (exit) {
  if (exit.code === 0) {
    console.log('ok   SIGTERM: the server drained and exited 0');
  } else {
    failures++;
    console.log(`FAIL SIGTERM: the server exited with code ${exit.code}, signal ${exit.signal}`);
  }
}
clearTimeout(watchdog);
if (failures > 0) {
  console.log(`--- last lines of the server's log ---\n${serverLog.slice(-40).join('\n')}`);
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('all checks passed');
process.exit(0);
