// The tool calls of a policy model's turn (activities/agents/tool-calls.ts): Hermes blocks and
// Mistral's [TOOL_CALLS] array are parsed into calls and the text around them; every malformed,
// unknown, invalid, excessive or hostile call is an error whose message names the call and the
// problem for the model, never an exception; only a bad tool list or bad limits throw.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  defaultToolCallLimits,
  parseToolCalls,
  ToolCallParser,
  type ParsedTurn,
  type ToolSchema,
} from '../../activities/agents/tool-calls.js';
import { BadInputError } from '../../activities/rewards/errors.js';

const tools: ToolSchema[] = [
  {
    type: 'function',
    function: {
      name: 'calculator',
      description: 'Evaluates an arithmetic expression',
      parameters: {
        type: 'object',
        properties: { expression: { type: 'string' } },
        required: ['expression'],
        additionalProperties: false,
      },
    },
  },
  { type: 'function', function: { name: 'python', parameters: { type: 'object' } } },
  { type: 'function', function: { name: 'now' } },
];

const hermes = (text: string, limits = {}): ParsedTurn => parseToolCalls(text, 'hermes', tools, limits);
const mistral = (text: string, limits = {}): ParsedTurn => parseToolCalls(text, 'mistral', tools, limits);
const block = (json: string): string => `<tool_call>\n${json}\n</tool_call>`;
const calc = (expression: unknown): string =>
  JSON.stringify({ name: 'calculator', arguments: { expression } });
const kinds = (turn: ParsedTurn): string[] => turn.errors.map((e) => e.kind);
const deepArray = (depth: number): string => '['.repeat(depth) + ']'.repeat(depth);

describe('hermes tool calls', () => {
  it('parses one call and keeps the text around it as the content', () => {
    const turn = hermes(`I will compute it.\n${block(calc('2+2'))}\n`);
    assert.equal(turn.content, 'I will compute it.');
    assert.deepEqual(turn.calls, [{ index: 0, name: 'calculator', arguments: { expression: '2+2' } }]);
    assert.deepEqual(turn.errors, []);
  });

  it('parses several calls, with or without white space around the JSON', () => {
    const text = [
      'First ',
      block(calc('1+1')),
      ' then ',
      `<tool_call>${JSON.stringify({ name: 'python', arguments: { code: 'print(1)' } })}</tool_call>`,
      ` and <tool_call>  \n\t${JSON.stringify({ name: 'now', arguments: {} })}  </tool_call> done`,
    ].join('');
    const turn = hermes(text);
    assert.deepEqual(
      turn.calls.map((c) => [c.index, c.name, c.arguments]),
      [
        [0, 'calculator', { expression: '1+1' }],
        [1, 'python', { code: 'print(1)' }],
        [2, 'now', {}],
      ],
    );
    assert.equal(turn.content, 'First  then  and  done');
    assert.deepEqual(turn.errors, []);
  });

  it('gives the trimmed text and no calls for a turn without any', () => {
    assert.deepEqual(hermes('  The answer is 4.\n'), { content: 'The answer is 4.', calls: [], errors: [] });
  });

  it('accepts arguments given as a JSON string holding an object', () => {
    const args = JSON.stringify({ expression: '3*3' });
    const turn = hermes(block(JSON.stringify({ name: 'calculator', arguments: args })));
    assert.deepEqual(turn.calls, [{ index: 0, name: 'calculator', arguments: { expression: '3*3' } }]);
    assert.deepEqual(turn.errors, []);
  });

  it('takes missing arguments as an empty object, which the schema still judges', () => {
    assert.deepEqual(hermes(block('{"name": "now"}')).calls, [{ index: 0, name: 'now', arguments: {} }]);
    const turn = hermes(block('{"name": "calculator"}'));
    assert.deepEqual(kinds(turn), ['bad-arguments']);
    assert.match(turn.errors[0]!.message, /must have required property 'expression'/);
  });

  it('reports a call that is not JSON, and goes on with the next', () => {
    const turn = hermes(block('{"name": "calculator", "arguments": {') + block(calc('1')));
    assert.deepEqual(kinds(turn), ['bad-json']);
    assert.equal(turn.errors[0]!.index, 0);
    assert.match(turn.errors[0]!.message, /^tool call 1: not valid JSON: /);
    assert.deepEqual(
      turn.calls.map((c) => c.index),
      [1],
    );
    assert.deepEqual(kinds(hermes('<tool_call>  </tool_call>')), ['bad-json']);
  });

  it('reports a call the turn ended inside as unclosed, not as content', () => {
    const turn = hermes(`Let me see. ${block(calc('1'))} <tool_call>\n{"name": "calculator", "argu`);
    assert.equal(turn.content, 'Let me see.');
    assert.equal(turn.calls.length, 1);
    assert.deepEqual(turn.errors, [
      {
        index: 1,
        kind: 'unclosed',
        message:
          'tool call 2: <tool_call> is not closed by </tool_call> (the turn may have run out of tokens)',
      },
    ]);
  });

  it('reports a call opened again before it closed as unclosed, and parses the one after', () => {
    const turn = hermes(`<tool_call>{"name": "calc <tool_call>${calc('5')}</tool_call>`);
    assert.deepEqual(kinds(turn), ['unclosed']);
    assert.equal(turn.errors[0]!.index, 0);
    assert.deepEqual(turn.calls, [{ index: 1, name: 'calculator', arguments: { expression: '5' } }]);
    assert.equal(turn.content, '');
  });

  it('never throws on any prefix of a turn, and a cut inside a call is an error', () => {
    const text = `Thinking. ${block(calc('7*6'))}\n${block(JSON.stringify({ name: 'python', arguments: '{"code": "x"}' }))}`;
    for (let end = 0; end <= text.length; end++) {
      const prefix = text.slice(0, end);
      const turn = hermes(prefix);
      const opens = prefix.split('<tool_call>').length - 1;
      assert.equal(turn.calls.length + turn.errors.length, opens, `prefix ${JSON.stringify(prefix)}`);
    }
    assert.equal(hermes(text).calls.length, 2);
  });
});

describe('mistral tool calls', () => {
  it('parses the array after [TOOL_CALLS], ids kept, the text before it as the content', () => {
    const calls = [
      { name: 'calculator', arguments: { expression: '2+2' }, id: 'a1b2c3d4e' },
      { name: 'python', arguments: { code: 'print(2)' } },
    ];
    const turn = mistral(`Computing both.[TOOL_CALLS] ${JSON.stringify(calls)}`);
    assert.equal(turn.content, 'Computing both.');
    assert.deepEqual(turn.calls, [
      { index: 0, name: 'calculator', arguments: { expression: '2+2' }, id: 'a1b2c3d4e' },
      { index: 1, name: 'python', arguments: { code: 'print(2)' } },
    ]);
    assert.deepEqual(turn.errors, []);
  });

  it('parses a single call, and a lone object as a one-call array', () => {
    const one = { name: 'calculator', arguments: { expression: '1' } };
    const expected = [{ index: 0, name: 'calculator', arguments: { expression: '1' } }];
    assert.deepEqual(mistral(`[TOOL_CALLS][${JSON.stringify(one)}]`).calls, expected);
    assert.deepEqual(mistral(`[TOOL_CALLS]${JSON.stringify(one)}`).calls, expected);
  });

  it('gives the whole text as the content when there is no [TOOL_CALLS]', () => {
    assert.deepEqual(mistral(' It is 4. '), { content: 'It is 4.', calls: [], errors: [] });
  });

  it('accepts arguments given as a JSON string', () => {
    const turn = mistral(
      `[TOOL_CALLS]${JSON.stringify([{ name: 'calculator', arguments: '{"expression": "9"}' }])}`,
    );
    assert.deepEqual(turn.calls[0]?.arguments, { expression: '9' });
  });

  it('reports an array that is not JSON, cut short or empty', () => {
    for (const text of [
      '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expr',
      '[TOOL_CALLS]',
      '[TOOL_CALLS] [] x',
    ]) {
      const turn = mistral(`Hi ${text}`);
      assert.deepEqual(kinds(turn), ['bad-json'], text);
      assert.match(turn.errors[0]!.message, /^tool calls: /);
      assert.equal(turn.content, 'Hi');
    }
  });

  it('checks each element of the array on its own', () => {
    const turn = mistral(
      `[TOOL_CALLS]${JSON.stringify([{ name: 'calc', arguments: {} }, 5, { name: 'now' }])}`,
    );
    assert.deepEqual(kinds(turn), ['unknown-tool', 'not-an-object']);
    assert.deepEqual(
      turn.errors.map((e) => e.index),
      [0, 1],
    );
    assert.deepEqual(turn.calls, [{ index: 2, name: 'now', arguments: {} }]);
  });
});

describe('tool call errors', () => {
  it('names an unknown tool and lists the known ones', () => {
    const turn = hermes(block(calc('1')) + block('{"name": "calc", "arguments": {}}'));
    assert.deepEqual(turn.errors, [
      {
        index: 1,
        kind: 'unknown-tool',
        name: 'calc',
        message: 'tool call 2: unknown tool "calc"; the tools are: calculator, python, now',
      },
    ]);
    const none = parseToolCalls(block('{"name": "calc"}'), 'hermes', []);
    assert.equal(none.errors[0]?.message, 'tool call 1: unknown tool "calc"; the tools are: (none)');
  });

  it('clips a huge unknown name in the message', () => {
    const name = 'x'.repeat(10_000);
    const turn = hermes(block(JSON.stringify({ name, arguments: {} })));
    assert.equal(turn.errors[0]?.kind, 'unknown-tool');
    assert.ok(turn.errors[0]!.message.length < 200, turn.errors[0]!.message.slice(0, 300));
  });

  it('reports a call that is not an object', () => {
    for (const json of ['["calculator", {}]', '"calculator"', '42', 'null']) {
      const turn = hermes(block(json));
      assert.deepEqual(kinds(turn), ['not-an-object'], json);
      assert.match(
        turn.errors[0]!.message,
        /^tool call 1: expected \{"name": \.\.\., "arguments": \{\.\.\.\}\}, got /,
      );
    }
  });

  it('reports a call without a string name', () => {
    for (const json of ['{"arguments": {}}', '{"name": 3, "arguments": {}}', '{"name": ""}']) {
      const turn = hermes(block(json));
      assert.deepEqual(kinds(turn), ['missing-name'], json);
      assert.equal(turn.errors[0]?.name, undefined);
    }
  });

  it('reports arguments that do not match the schema, with the path', () => {
    const turn = hermes(block(calc(42)));
    assert.deepEqual(turn.errors, [
      {
        index: 0,
        kind: 'bad-arguments',
        name: 'calculator',
        message: 'tool call 1: arguments do not match the schema of "calculator": /expression must be string',
      },
    ]);
    assert.equal(turn.calls.length, 0);
    const extra = hermes(block('{"name": "calculator", "arguments": {"expression": "1", "mode": "deg"}}'));
    assert.match(extra.errors[0]!.message, /must NOT have additional properties: "mode"$/);
  });

  it('reports arguments that are not an object, or a string that does not hold one', () => {
    const cases: [unknown, RegExp][] = [
      [[1, 2], /"arguments" of "python" must be a JSON object, got an array$/],
      [null, /must be a JSON object, got null$/],
      ['{"code": ', /is a string that is not valid JSON: /],
      ['[1]', /got a string holding an array$/],
    ];
    for (const [args, message] of cases) {
      const turn = hermes(block(JSON.stringify({ name: 'python', arguments: args })));
      assert.deepEqual(kinds(turn), ['bad-arguments'], JSON.stringify(args));
      assert.equal(turn.errors[0]?.name, 'python');
      assert.match(turn.errors[0]!.message, message);
    }
  });

  it('runs at most maxCalls calls and reports the rest once', () => {
    const text = [1, 2, 3, 4].map((n) => block(calc(String(n)))).join('\n');
    const turn = hermes(text, { maxCalls: 2 });
    assert.deepEqual(
      turn.calls.map((c) => c.arguments['expression']),
      ['1', '2'],
    );
    assert.deepEqual(turn.errors, [
      {
        index: 2,
        kind: 'too-many-calls',
        message: 'tool call 3: 4 tool calls in one turn, past the limit of 2; calls 3 to 4 were not run',
      },
    ]);
    const array = JSON.stringify(
      [1, 2, 3].map((n) => ({ name: 'calculator', arguments: { expression: `${n}` } })),
    );
    const m = mistral(`[TOOL_CALLS]${array}`, { maxCalls: 2 });
    assert.equal(m.calls.length, 2);
    assert.deepEqual(kinds(m), ['too-many-calls']);
    assert.match(m.errors[0]!.message, /call 3 was not run$/);
    assert.equal(hermes(text).calls.length, 4, 'the default allows more');
  });

  it('reports a call past maxCallBytes without running it', () => {
    const big = calc('1+'.repeat(40_000));
    const turn = hermes(block(big));
    assert.deepEqual(kinds(turn), ['too-large']);
    assert.match(turn.errors[0]!.message, /past the limit of 65536$/);
    assert.equal(hermes(block(big), { maxCallBytes: 200_000 }).calls.length, 1);
    const array = `[TOOL_CALLS][${big}]`;
    assert.deepEqual(kinds(mistral(array)), ['too-large'], 'one element past the limit');
    const whole = mistral(`[TOOL_CALLS][${big}]`, { maxCalls: 1 });
    assert.deepEqual(kinds(whole), ['too-large']);
    assert.match(whole.errors[0]!.message, /^tool calls: the JSON after \[TOOL_CALLS\] is \d+ bytes/);
  });

  it('reports a call nested past maxDepth', () => {
    const args = (depth: number) => `{"name": "python", "arguments": {"code": ${deepArray(depth)}}}`;
    // The call is level 1, its arguments 2, the arrays from 3.
    assert.equal(hermes(block(args(defaultToolCallLimits.maxDepth - 2))).calls.length, 1);
    const turn = hermes(block(args(defaultToolCallLimits.maxDepth - 1)));
    assert.deepEqual(kinds(turn), ['too-deep']);
    assert.match(turn.errors[0]!.message, /^tool call 1: the call nests more than 64 levels deep/);
    const inString = hermes(
      block(JSON.stringify({ name: 'python', arguments: `{"code": ${deepArray(1000)}}` })),
    );
    assert.deepEqual(kinds(inString), ['bad-arguments']);
    assert.match(inString.errors[0]!.message, /nest more than 64 levels deep/);
  });

  it('survives arguments nested 100,000 deep in every form', () => {
    const deep = `{"name": "python", "arguments": {"code": ${deepArray(100_000)}}}`;
    assert.deepEqual(kinds(hermes(block(deep))), ['too-large']);
    const roomy = { maxCallBytes: 1024 * 1024 };
    assert.deepEqual(kinds(hermes(block(deep), roomy)), ['too-deep'], 'parsed, then refused for its depth');
    assert.deepEqual(kinds(mistral(`[TOOL_CALLS][${deep}]`, roomy)), ['too-deep']);
    assert.deepEqual(kinds(mistral(`[TOOL_CALLS]${deepArray(100_000)}`, roomy)), ['too-deep']);
    const asString = JSON.stringify({ name: 'python', arguments: `{"code": ${deepArray(100_000)}}` });
    assert.deepEqual(kinds(hermes(block(asString), roomy)), ['bad-arguments']);
  });
});

describe('tool lists and limits', () => {
  it('throws for a schema that does not compile, naming the tool', () => {
    const bad: ToolSchema[] = [
      tools[0]!,
      {
        type: 'function',
        function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'strng' } } } },
      },
    ];
    assert.throws(
      () => new ToolCallParser(bad, 'hermes'),
      (err: unknown) =>
        err instanceof BadInputError &&
        /^tool "search": its parameters are not a valid JSON Schema: /.test(err.message),
    );
    const badRef: ToolSchema[] = [
      { type: 'function', function: { name: 'lookup', parameters: { $ref: '#/definitions/missing' } } },
    ];
    assert.throws(() => parseToolCalls('', 'hermes', badRef), /tool "lookup"/);
  });

  it('throws for a malformed or duplicated tool', () => {
    const twice = [tools[1]!, tools[1]!];
    assert.throws(() => new ToolCallParser(twice, 'hermes'), /tool "python" is declared twice/);
    const nameless = [{ type: 'function', function: { description: 'x' } }] as unknown as ToolSchema[];
    assert.throws(() => new ToolCallParser(nameless, 'hermes'), /^BadInputError: tool 1: expected/);
    const notSchema = [
      { type: 'function', function: { name: 'f', parameters: 'object' } },
    ] as unknown as ToolSchema[];
    assert.throws(
      () => new ToolCallParser(notSchema, 'mistral'),
      /tool "f": its parameters must be a JSON Schema object/,
    );
  });

  it('throws for bad limits or an unknown format', () => {
    assert.throws(() => new ToolCallParser(tools, 'hermes', { maxCalls: 0 }), /maxCalls=0/);
    assert.throws(() => new ToolCallParser(tools, 'hermes', { maxCallBytes: 1.5 }), /maxCallBytes=1.5/);
    assert.throws(
      () => new ToolCallParser(tools, 'hermes', { maxDepth: 1000 }),
      /maxDepth=1000 is not between 2 and 100/,
    );
    assert.throws(() => new ToolCallParser(tools, 'llama' as 'hermes'), /unknown tool call format "llama"/);
  });

  it('parses many turns with one parser, its limits filled in from the defaults', () => {
    const parser = new ToolCallParser(tools, 'hermes', { maxCalls: 3 });
    assert.deepEqual(parser.limits, { ...defaultToolCallLimits, maxCalls: 3 });
    assert.deepEqual(parser.toolNames, ['calculator', 'python', 'now']);
    assert.equal(parser.parse(block(calc('1'))).calls.length, 1);
    assert.deepEqual(kinds(parser.parse(block(calc(1)))), ['bad-arguments']);
  });
});
