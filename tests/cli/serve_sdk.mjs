// serve_sdk.mjs - the official `openai` SDK and the Vercel AI SDK (`ai` +
// `@ai-sdk/openai-compatible`) against `rebound serve` on loopback:
// structured output (response_format json_schema / json_object,
// generateObject, Output.object), tool calls through a whole agent turn
// (call, tool result, answer), logprobs, penalties, logit_bias,
// embeddings, and the errors. Run by cli_serve_sdk.sh with
// node serve_sdk.mjs BASE_URL, from the folder that holds node_modules.
import OpenAI from 'openai';
import { generateText, generateObject, Output, tool, jsonSchema, stepCountIs } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';

const base = process.argv[2];
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none' });
let checks = 0;
function ok(cond, what) {
    checks++;
    if (!cond) {
        console.error('FAIL: ' + what);
        process.exit(1);
    }
    console.log('-- ' + what);
}

const person = {
    type: 'object',
    properties: {
        name: { type: 'string', maxLength: 16 },
        age: { type: 'integer', minimum: 0, maximum: 120 },
        tags: { type: 'array', items: { type: 'string', enum: ['a', 'b', 'c'] }, maxItems: 3 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
};
function isPerson(o) {
    return o && typeof o.name === 'string' && [...o.name].length <= 16 &&
        Number.isInteger(o.age) && o.age >= 0 && o.age <= 120 && Array.isArray(o.tags) &&
        o.tags.length <= 3 && o.tags.every(t => ['a', 'b', 'c'].includes(t)) &&
        Object.keys(o).every(k => ['name', 'age', 'tags'].includes(k));
}

// ---- openai: response_format --------------------------------------------
for (let seed = 0; seed < 5; seed++) {
    const r = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'A person, as JSON.' }], seed,
        max_tokens: 400, temperature: 1,
        response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
    });
    const o = JSON.parse(r.choices[0].message.content);
    ok(isPerson(o), `openai json_schema seed ${seed}: ${r.choices[0].message.content.slice(0, 60)}`);
}
{
    const stream = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'JSON please' }], seed: 9, max_tokens: 400,
        response_format: { type: 'json_object' }, stream: true,
    });
    let text = '';
    for await (const c of stream)
        text += c.choices[0]?.delta?.content ?? '';
    const o = JSON.parse(text);
    ok(o && typeof o === 'object' && !Array.isArray(o), 'openai json_object, streamed, is an object');
}
{
    const r = await client.completions.create({
        model: 'm', prompt: 'Person:', seed: 3, max_tokens: 300,
        response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } },
    });
    ok(isPerson(JSON.parse(r.choices[0].text)), 'openai completions json_schema');
}

// ---- openai: tools, a whole turn ---------------------------------------------
const weatherTool = {
    type: 'function',
    function: {
        name: 'get_weather', description: 'The weather in a city',
        parameters: {
            type: 'object', properties: { city: { type: 'string', maxLength: 20 },
                                          unit: { type: 'string', enum: ['c', 'f'] } },
            required: ['city', 'unit'], additionalProperties: false,
        },
    },
};
for (let seed = 0; seed < 5; seed++) {
    const messages = [{ role: 'user', content: 'Weather in Oslo?' }];
    const r1 = await client.chat.completions.create({
        model: 'm', messages, tools: [weatherTool], tool_choice: 'required', seed, max_tokens: 800, parallel_tool_calls: false,
    });
    const m1 = r1.choices[0].message;
    ok(r1.choices[0].finish_reason === 'tool_calls' && m1.tool_calls?.length >= 1,
       `openai required tool call, seed ${seed}`);
    const args = JSON.parse(m1.tool_calls[0].function.arguments);
    ok(m1.tool_calls[0].function.name === 'get_weather' && typeof args.city === 'string' &&
       ['c', 'f'].includes(args.unit) && Object.keys(args).length === 2,
       `openai tool arguments validate: ${m1.tool_calls[0].function.arguments.slice(0, 50)}`);
    messages.push(m1, { role: 'tool', tool_call_id: m1.tool_calls[0].id, content: '12 degrees' });
    const r2 = await client.chat.completions.create({
        model: 'm', messages, tools: [weatherTool], tool_choice: 'none', seed, max_tokens: 20,
    });
    ok(typeof r2.choices[0].message.content === 'string' && !r2.choices[0].message.tool_calls,
       'openai answer after the tool result (tool_choice none)');
}
{
    const stream = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'Weather?' }], tools: [weatherTool],
        tool_choice: { type: 'function', function: { name: 'get_weather' } }, stream: true, seed: 4,
        max_tokens: 800, parallel_tool_calls: false,
    });
    let calls = [], finish = null;
    for await (const c of stream) {
        for (const tc of c.choices[0]?.delta?.tool_calls ?? [])
            calls[tc.index] = tc;
        finish = c.choices[0]?.finish_reason ?? finish;
    }
    ok(finish === 'tool_calls' && calls.length === 1 &&
       JSON.parse(calls[0].function.arguments).city !== undefined, 'openai named tool call, streamed');
}

// ---- openai: logprobs, penalties, logit_bias ------------------------------
{
    const r = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 8, seed: 1,
        logprobs: true, top_logprobs: 3,
    });
    const lp = r.choices[0].logprobs.content;
    ok(lp.length === r.usage.completion_tokens && lp.every(t => t.logprob <= 0 && t.top_logprobs.length === 3 &&
       t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob), 'openai logprobs with 3 alternatives per token');
    const c = await client.completions.create({ model: 'm', prompt: 'x', max_tokens: 5, logprobs: 2, seed: 1 });
    ok(c.choices[0].logprobs.tokens.length === c.usage.completion_tokens &&
       c.choices[0].logprobs.top_logprobs.length === c.usage.completion_tokens, 'openai completions logprobs');
}
{
    const ask = extra => client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'repeat' }], max_tokens: 40, temperature: 0, ...extra,
    });
    const plain = (await ask({})).choices[0].message.content;
    const pen = (await ask({ frequency_penalty: 2, presence_penalty: 2 })).choices[0].message.content;
    ok(plain !== pen, 'openai penalties change the greedy reply');
    const t = await fetch(base + '/tokenize', { method: 'POST', body: JSON.stringify({ content: 'zq' }) });
    const tok = (await t.json()).tokens.at(-1);
    const forced = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'repeat' }], max_tokens: 3, temperature: 0,
        logit_bias: { [tok]: 100 },
    });
    const d = await fetch(base + '/detokenize', { method: 'POST', body: JSON.stringify({ tokens: [tok, tok, tok] }) });
    ok(forced.choices[0].message.content === (await d.json()).content,
       'openai logit_bias +100 forces a token (/tokenize, /detokenize agree)');
    const req = { messages: [{ role: 'user', content: 'repeat' }], max_tokens: 3, temperature: 0 };
    const it = await fetch(base + '/v1/chat/completions/input_tokens', { method: 'POST', body: JSON.stringify(req) });
    const ij = await it.json();
    ok(ij.object === 'response.input_tokens' && ij.input_tokens === forced.usage.prompt_tokens,
       '/v1/chat/completions/input_tokens is the chat\'s prompt_tokens (' + ij.input_tokens + ')');
}

// ---- openai: embeddings ---------------------------------------------------------
{
    const e = await client.embeddings.create({ model: 'm', input: ['hello', 'world', 'hello'] });
    const norm = v => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    ok(e.data.length === 3 && e.data.every(d => Math.abs(norm(d.embedding) - 1) < 1e-4) &&
       e.data[0].embedding.every((x, i) => Math.abs(x - e.data[2].embedding[i]) < 1e-6) &&
       e.usage.prompt_tokens > 0, 'openai embeddings (base64 by default): unit length, same text same vector');
    const f = await client.embeddings.create({ model: 'm', input: 'hello', encoding_format: 'float' });
    ok(f.data[0].embedding.every((x, i) => Math.abs(x - e.data[0].embedding[i]) < 1e-6), 'float = base64');
}

// ---- openai: errors -------------------------------------------------------------
async function status(p) {
    try { await p; return 200; } catch (err) { return [err.status, err.message]; }
}
{
    let [s, msg] = await status(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }], n: 2 }));
    ok(s === 400 && /'n'/.test(msg), 'openai n = 2: 400 naming n');
    [s, msg] = await status(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'low' }));
    ok(s === 400 && /reasoning_effort/.test(msg), 'openai an unsupported field: 400 naming it');
    [s, msg] = await status(client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } } }));
    ok(s === 400 && /'not'/.test(msg), 'openai an unsupported schema keyword: 400 naming it');
}

// ---- the Vercel AI SDK -------------------------------------------------------
const provider = createOpenAICompatible({ name: 'rebound', baseURL: base + '/v1', supportsStructuredOutputs: true });
const model = provider.chatModel('m');
{
    const { object } = await generateObject({ model, schema: jsonSchema(person), prompt: 'A person', seed: 2, maxOutputTokens: 400 });
    ok(isPerson(object), 'ai generateObject');
    const r = await generateText({ model, output: Output.object({ schema: jsonSchema(person) }), prompt: 'A person', seed: 5, maxOutputTokens: 400 });
    ok(isPerson(r.output), 'ai generateText with Output.object');
}
{
    let called = null;
    const r = await generateText({
        model, prompt: 'Weather in Oslo?', seed: 7, maxOutputTokens: 1500,
        tools: {
            get_weather: tool({
                description: 'The weather in a city',
                inputSchema: jsonSchema(weatherTool.function.parameters),
                execute: async input => { called = input; return { degrees: 12 }; },
            }),
        },
        stopWhen: stepCountIs(3),
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
    });
    ok(called && typeof called.city === 'string' && r.steps.length === 2 &&
       r.steps[0].finishReason === 'tool-calls' && typeof r.text === 'string',
       'ai agent turn: a required call, the tool run, the answer');
}
console.log(`PASS: ${checks} checks`);
