// check.mjs: drive cl-mcp with the official TypeScript MCP SDK client, as
// most hosts do (docs/interop.md): every tool with good arguments, with
// arguments that make the tool fail, and with arguments its input schema
// rejects; long work (an evaluation that outlives its answer window, then
// await-evaluation and read-output); MCP tasks through the SDK's
// experimental task API (client.experimental.tasks); then each tool again
// against a cl-mcp that has no image.  The SDK's callTool checks every
// result's structuredContent, errors included, against the outputSchema
// that tools/list gave (Ajv, draft-07 by default): a result that does not
// match is a failure here.  Places the fixture system reports are compared
// with its files.
//
//   node check.mjs [COMMAND [ARG...]]      default: CL_MCP_COMMAND, else
//                                          .venv/bin/cl-mcp of this checkout
//   node check.mjs .venv/bin/cl-mcp --connect 127.0.0.1:4005   (attach mode)
//
// One line per step, `ok` or `FAILED` with the reason; exit status 1 when
// any step failed.  The SDK's default environment for the child (HOME, PATH,
// USER, ...) is extended with the CL_MCP_* variables of this process.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";
import {
  CallToolResultSchema,
  ErrorCode,
  LATEST_PROTOCOL_VERSION,
  LoggingMessageNotificationSchema,
  McpError,
  RELATED_TASK_META_KEY,
} from "@modelcontextprotocol/sdk/types.js";
import { readFileSync, mkdtempSync, copyFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, "..", "..");
const FIXTURES = join(ROOT, "tests", "fixtures", "lisp");
const FIXTURE = join(FIXTURES, "cl-mcp-fixture");
const SHAPES = join(FIXTURE, "shapes.lisp");
const CALLERS = join(FIXTURE, "callers.lisp");
const RUN_TESTS_FIXTURE = join(FIXTURES, "run-tests-fixture");
const SDK_VERSION = JSON.parse(
  readFileSync(join(HERE, "node_modules", "@modelcontextprotocol", "sdk", "package.json"), "utf8")).version;

const TOOLS = [
  "evaluate-lisp", "invoke-restart", "backtrace", "eval-in-frame", "list-definitions",
  "reset-session", "load-system", "xref", "compile-file", "compile-form", "apropos", "macroexpand",
  "inspect", "find-definition", "describe-symbol", "read-output", "await-evaluation",
  "threads", "profile",
  "run-tests", "edit-form", "read-lisp-file",
];
// The tools cl-mcp runs as MCP tasks (2025-11-25: execution.taskSupport "optional")
const TASK_TOOLS = ["evaluate-lisp", "load-system", "compile-file", "run-tests"];
const TASKS_VERSION = "2025-11-25";
const CIRCLE = "(make-instance 'cl-mcp-fixture:circle :radius 2 :name \"disc\")";
const LONG = { timeout: 300_000 }; // load-system and compile-file may compile for a while

// ---------------------------------------------------------------- reporting

let failures = 0;

function oneLine(value, limit = 160) {
  const text = String(value).replace(/\s*\n\s*/g, " | ");
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
}

function report(ok, label, detail) {
  if (!ok) failures += 1;
  console.log(`${ok ? "ok    " : "FAILED"}  ${label}${detail ? ": " + oneLine(detail, ok ? 120 : 600) : ""}`);
}

class Mismatch extends Error {}

function expect(condition, what) {
  if (!condition) throw new Mismatch(what);
}

function textOf(result) {
  return (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

// --------------------------------------------------------------- the fixture

const shapesLines = readFileSync(SHAPES, "utf8").split("\n");
const callersLines = readFileSync(CALLERS, "utf8").split("\n");

/** The 1-based line and column of the first line of LINES that contains TEXT. */
function placeOf(lines, text) {
  const index = lines.findIndex((line) => line.includes(text));
  if (index < 0) throw new Error(`${text} not in the fixture`);
  return { line: index + 1, column: lines[index].indexOf(text) + 1 };
}

/** Whether PLACE ({file, line, column, snippet}) points at the snippet's first line in its file. */
function snippetMatchesFile(place) {
  const lines = readFileSync(place.file, "utf8").split("\n");
  const first = (place.snippet ?? "").split("\n")[0].trim();
  return lines[place.line - 1]?.slice(place.column - 1).trim().startsWith(first) && first !== "";
}

function placeText(p) {
  return `${p.file?.replace(ROOT + "/", "")}:${p.line}:${p.column}`;
}

// ------------------------------------------------------------------ the client

/** StdioClientTransport with a recorder: the negotiated version (the SDK hands
 * it to transports that take it), the notifications received, and the last
 * tools/call result as it came (to show what the SDK's validation rejected). */
class RecordingTransport {
  constructor(inner) {
    this.inner = inner;
    this.notifications = [];
    this.protocolVersion = undefined;
    this.lastToolResult = undefined;
  }
  async start() {
    this.inner.onmessage = (message) => {
      if (message.method && message.id === undefined) this.notifications.push(message);
      if (message.result?.content) this.lastToolResult = message.result;
      this.onmessage?.(message);
    };
    this.inner.onclose = () => this.onclose?.();
    this.inner.onerror = (error) => this.onerror?.(error);
    return this.inner.start();
  }
  send(message, options) { return this.inner.send(message, options); }
  close() { return this.inner.close(); }
  setProtocolVersion(version) { this.protocolVersion = version; }
}

/** The server's command line: argv, else CL_MCP_COMMAND (split at blanks),
 * else this checkout's .venv/bin/cl-mcp.  A relative path is taken from the
 * current directory (the child itself runs in the checkout's root). */
function serverCommand() {
  let [command, ...args] = process.argv.slice(2);
  if (command === undefined && process.env.CL_MCP_COMMAND) {
    [command, ...args] = process.env.CL_MCP_COMMAND.trim().split(/\s+/);
  }
  if (command === undefined) return { command: join(ROOT, ".venv", "bin", "cl-mcp"), args: [] };
  return { command: command.includes("/") ? resolve(command) : command, args };
}

/** A client for cl-mcp started as COMMAND ARGS (not yet connected). */
function newSession(command, args) {
  const env = { ...getDefaultEnvironment() };
  for (const [key, value] of Object.entries(process.env)) if (key.startsWith("CL_MCP_")) env[key] = value;
  const stdio = new StdioClientTransport({ command, args, env, cwd: ROOT, stderr: "pipe" });
  const session = {
    stdio,
    transport: new RecordingTransport(stdio),
    // capabilities.tasks (ClientTasksCapabilitySchema) is present but empty:
    // list, cancel and requests would say that the server may make tasks of
    // *this client's* requests (sampling, elicitation) and list or cancel
    // them here, which this client cannot.  Making tasks of tools/call needs
    // only the server's capabilities.tasks.requests.tools.call.
    client: new Client({ name: "cl-mcp-ts-interop", version: "0.1.0" }, { capabilities: { tasks: {} } }),
    stderr: "",
    logMessages: [],
    errors: [], // what the SDK reported through onerror (messages it could not take, ...)
    // Each tool's outputSchema compiled by the SDK's default validator (the
    // one callTool uses), for results callTool does not see: tasks/result's.
    outputValidators: new Map(),
  };
  session.client.onerror = (error) => { session.errors.push(error); };
  stdio.stderr?.on("data", (chunk) => { session.stderr = (session.stderr + chunk).slice(-20_000); });
  session.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { session.logMessages.push(n.params); });
  return session;
}

let current; // the session the steps below talk to

/** Run STEP (an async function returning a short detail); report it.  When
 * the SDK rejected a result's structuredContent, show what it was. */
async function step(label, fn) {
  const before = current?.transport.lastToolResult;
  try {
    report(true, label, await fn());
  } catch (error) {
    let why = error instanceof Mismatch ? error.message
      : error instanceof McpError ? `${error.constructor.name} ${error.code}: ${error.message}`
      : `${error?.name ?? "Error"}: ${error?.message ?? error}`;
    const last = current?.transport.lastToolResult;
    if (/output schema|structured content/i.test(why) && last && last !== before) {
      why += ` | isError ${last.isError}, structuredContent ${JSON.stringify(last.structuredContent)}`;
    }
    report(false, label, why);
  }
}

/** callTool, its structured content validated by the SDK; FN checks the result. */
function call(label, name, args, fn = () => undefined, options) {
  return step(`${name}${label ? " " + label : ""}`, async () => {
    const result = await current.client.callTool({ name, arguments: args }, undefined, options);
    return fn(result, result.structuredContent ?? {}, textOf(result));
  });
}

function expectOk(result) {
  expect(!result.isError, `isError: ${textOf(result)}`);
}

function expectToolError(result, type) {
  expect(result.isError === true, `expected isError, got: ${textOf(result)}`);
  const text = textOf(result);
  expect(text.startsWith(`[ERROR] ${type}`), `expected [ERROR] ${type}, got: ${text}`);
  return oneLine(text, 100);
}

/** A call the server must refuse with a JSON-RPC error CODE. */
function refused(label, name, args, code) {
  return step(`${name} ${label}`, async () => {
    try {
      const result = await current.client.callTool({ name, arguments: args });
      throw new Mismatch(`no JSON-RPC error; result: ${textOf(result)}`);
    } catch (error) {
      if (error instanceof Mismatch) throw error;
      expect(error instanceof McpError, `not an McpError: ${error}`);
      expect(error.code === code, `code ${error.code}, expected ${code}: ${error.message}`);
      return `refused, ${error.code} ${error.message}`;
    }
  });
}

/** Arguments the input schema rejects: from 2025-11-25 on a tool error the
 * model can read (SEP-1303), before it a JSON-RPC -32602 error; the SDK
 * passes either on.  Either is accepted from 2025-11-25 on, and named. */
function rejectedArguments(label, name, args) {
  return step(`${name} ${label}`, async () => {
    const version = current.transport.protocolVersion;
    let result;
    try {
      result = await current.client.callTool({ name, arguments: args });
    } catch (error) {
      expect(error instanceof McpError && error.code === ErrorCode.InvalidParams,
        `${error}`);
      return `JSON-RPC error ${error.code} under ${version}: ${error.message}`;
    }
    expect(version >= "2025-11-25", `a tool result under ${version}, which wants -32602: ${textOf(result)}`);
    expectToolError(result, "CL-MCP:INVALID-ARGUMENTS");
    return `tool error under ${version}: ${textOf(result)}`;
  });
}

async function connect(session) {
  current = session;
  let connected = false;
  await step("initialize", async () => {
    await session.client.connect(session.transport, LONG);
    connected = true;
    const info = session.client.getServerVersion();
    const caps = Object.keys(session.client.getServerCapabilities() ?? {}).join(",");
    const instructions = session.client.getInstructions();
    return `protocolVersion ${session.transport.protocolVersion}, server ${info?.name} ${info?.version}, `
      + `capabilities {${caps}}, instructions ${instructions ? instructions.length + " chars" : "none"}`;
  });
  return connected;
}

function alive(pid) {
  try { process.kill(pid, 0); return true; } catch { return false; }
}

/** Close the client as hosts do (stdin ends; the SDK sends SIGTERM after 2 s
 * and SIGKILL after 4): cl-mcp should exit by itself, and take the SBCL
 * images it started (their pids are in its log) with it. */
async function close(session) {
  await step("SDK client onerror", async () => {
    expect(session.errors.length === 0, session.errors.map((e) => e?.message ?? String(e)).join(" | "));
    return "nothing reported";
  });
  await step("close", async () => {
    const child = session.stdio._process; // the SDK's own handle on the child
    const started = Date.now();
    await session.client.close();
    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    expect(child?.exitCode !== null, `cl-mcp did not exit on end of stdin: signal ${child?.signalCode} after ${seconds} s`);
    const images = [...session.stderr.matchAll(/started SBCL \(pid (\d+)\)/g)].map((m) => Number(m[1]));
    for (let i = 0; i < 20 && images.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
    const left = images.filter(alive);
    expect(left.length === 0, `SBCL images still running after cl-mcp exited: ${left.join(" ")}`);
    return `cl-mcp exited with code ${child?.exitCode} in ${seconds} s; images started: ${images.length}, none left`;
  });
}

// ---------------------------------------------------------------------- steps

/** Every tool with good arguments, long work, tool errors, protocol errors,
 * progress, cancellation, tasks, reset. */
async function everyTool(files, attached) {
  await step("tools/list", async () => {
    const listed = await current.client.listTools(); // the SDK compiles each outputSchema here
    const names = listed.tools.map((t) => t.name);
    const missing = TOOLS.filter((t) => !names.includes(t));
    const extra = names.filter((t) => !TOOLS.includes(t));
    expect(missing.length === 0 && extra.length === 0, `missing ${missing}, unexpected ${extra}`);
    const withOutput = listed.tools.filter((t) => t.outputSchema).length;
    expect(withOutput === TOOLS.length, `${withOutput} tools with outputSchema`);
    const tasks = listed.tools.filter((t) => t.execution?.taskSupport).map((t) => `${t.name}:${t.execution.taskSupport}`);
    // Under 2025-11-25 the three long-running tools are optional tasks and
    // the server says so in capabilities.tasks; under other revisions none.
    const version = current.transport.protocolVersion;
    const want = version === TASKS_VERSION ? TASK_TOOLS.map((t) => `${t}:optional`) : [];
    expect(JSON.stringify([...tasks].sort()) === JSON.stringify([...want].sort()),
      `taskSupport ${tasks.join(" ") || "none"} under ${version}, expected ${want.join(" ") || "none"}`);
    expect(Boolean(current.client.getServerCapabilities()?.tasks?.requests?.tools?.call) === (version === TASKS_VERSION),
      `capabilities.tasks ${JSON.stringify(current.client.getServerCapabilities()?.tasks)} under ${version}`);
    for (const t of listed.tools) current.outputValidators.set(t.name, new AjvJsonSchemaValidator().getValidator(t.outputSchema));
    return `${names.length} tools, ${withOutput} with outputSchema, ${listed.tools.filter((t) => t.annotations).length} with annotations`
      + `, taskSupport ${tasks.length ? tasks.join(" ") : "none"}`;
  });

  await step("ping", async () => { await current.client.ping(); return "pong"; });

  await step("logging/setLevel debug", async () => {
    expect(current.client.getServerCapabilities()?.logging, "server has no logging capability");
    await current.client.setLoggingLevel("debug");
    return "accepted";
  });

  // evaluate-lisp
  await call("(+ 1 2)", "evaluate-lisp", { code: "(+ 1 2)" }, (r, s, t) => {
    expectOk(r);
    expect(t === `=> 3\n\n; Evaluation ${s.number}`, `text ${t}`);
    expect(s.success === true && s.values?.[0] === "3", `structured ${JSON.stringify(s)}`);
    return t;
  });
  await call("with output, warning, capture-time", "evaluate-lisp",
    { code: "(progn (print :hi) (format *error-output* \"oops~%\") (warn \"careful\") (values 1 \"x\"))", "capture-time": true },
    (r, s, t) => {
      expectOk(r);
      expect(s.values?.length === 2 && s.warnings?.length === 1, `structured ${JSON.stringify(s)}`);
      expect(/; Timing: /.test(t), "no timing line");
      return `values ${s.values.join(" ")}, ${s.warnings.length} warning`;
    });
  await call("defun in CL-USER", "evaluate-lisp",
    { code: "(defun interop-square (x) \"Square X.\" (* x x)) (interop-square 12)" }, (r, s, t) => {
      expectOk(r);
      // An attached image may have it from an earlier run: a redefinition warning
      expect(s.values?.[0] === "144" && (attached || t === `=> 144\n\n; Evaluation ${s.number}`), `text ${t}`);
      return oneLine(t);
    });

  // the fixture system, registered with ASDF as tests/integration/devtools.py does
  await call("asdf:load-asd of the fixture", "evaluate-lisp",
    { code: `(asdf:load-asd "${FIXTURE}/cl-mcp-fixture.asd")` }, (r, s, t) => { expectOk(r); return t; });
  await call("cl-mcp-fixture", "load-system", { system: "cl-mcp-fixture" }, (r, s, t) => {
    expectOk(r);
    expect(t.includes("Loaded: cl-mcp-fixture (version 1.2.3)"), `text ${t}`);
    return t;
  }, LONG);

  await call("type functions", "list-definitions", { type: "functions" }, (r, s, t) => {
    expectOk(r);
    expect(attached ? t.split("\n").includes("- INTEROP-SQUARE (X)") : t === "[Functions]\n- INTEROP-SQUARE (X)",
      `text ${t}`);
    const square = s.definitions?.find((d) => d.name === "INTEROP-SQUARE");
    expect(square?.kind === "function" && square.lambdaList === "(X)", `structured ${JSON.stringify(s)}`);
    return oneLine(t);
  });
  await call("(all)", "list-definitions", {}, (r, s, t) => { expectOk(r); return `${t.split("\n").length} lines`; });

  // places in the fixture, against its files
  const greet = placeOf(shapesLines, "(defun greet");
  await call("cl-mcp-fixture:greet", "find-definition", { symbol: "cl-mcp-fixture:greet" }, (r, s) => {
    expectOk(r);
    const d = s.definitions?.[0];
    expect(s.definitions?.length === 1 && d.type === "function", `definitions ${JSON.stringify(s.definitions)}`);
    expect(d.file === SHAPES && d.line === greet.line && d.column === greet.column,
      `place ${placeText(d)}, file has (defun greet at ${greet.line}:${greet.column}`);
    expect(snippetMatchesFile(d), `snippet ${JSON.stringify(d.snippet)} is not at ${placeText(d)}`);
    return `function at ${placeText(d)} (file: line ${greet.line})`;
  });
  await call("cl-mcp-fixture:area", "find-definition", { symbol: "area", package: "cl-mcp-fixture" }, (r, s) => {
    expectOk(r);
    const want = [["generic-function", placeOf(shapesLines, "(defgeneric area").line],
      ["method", placeOf(shapesLines, "(defmethod area ((shape circle))").line],
      ["method", placeOf(shapesLines, "(defmethod area ((shape square))").line]];
    const got = s.definitions.map((d) => [d.type, d.line]).sort((a, b) => a[1] - b[1]);
    expect(JSON.stringify(got) === JSON.stringify(want), `got ${JSON.stringify(got)}, file has ${JSON.stringify(want)}`);
    for (const d of s.definitions) expect(snippetMatchesFile(d), `snippet not at ${placeText(d)}`);
    const methods = s.definitions.filter((d) => d.type === "method").map((d) => d.specializers?.join(" "));
    return `${got.map(([t, l]) => `${t}@${l}`).join(" ")}; specializers ${methods.join(", ")}`;
  });
  await call("of a definition made by evaluate-lisp", "find-definition", { symbol: "interop-square" }, (r, s) => {
    expectOk(r);
    const d = s.definitions?.[0];
    expect(d && typeof d.evaluation === "number" && d.source?.startsWith("(defun interop-square"),
      `definitions ${JSON.stringify(s.definitions)}`);
    return `evaluation ${d.evaluation}`;
  });

  await call("calls cl-mcp-fixture:greet", "xref", { symbol: "cl-mcp-fixture:greet", relation: "calls" }, (r, s) => {
    expectOk(r);
    const want = [
      ["CL-MCP-FIXTURE::WELCOME-EVERYONE", placeOf(callersLines, "(defun welcome-everyone").line,
        placeOf(callersLines, "#'greet").line],
      ["CL-MCP-FIXTURE::LOUD-WELCOME", placeOf(callersLines, "(defun loud-welcome").line,
        placeOf(callersLines, "(greet name)").line],
    ];
    const got = s.references.map((x) => [x.name, x.line, x.referenceLine]);
    for (const w of want) {
      expect(got.some((g) => JSON.stringify(g) === JSON.stringify(w)),
        `got ${JSON.stringify(got)}, file has ${JSON.stringify(w)}`);
    }
    for (const x of s.references) {
      expect(x.file === CALLERS && snippetMatchesFile(x), `reference ${JSON.stringify(x)}`);
    }
    return got.map(([n, l, rl]) => `${n.split("::")[1]}@${l} (ref ${rl})`).join(", ");
  });
  await call("sets cl-mcp-fixture:*greeting*", "xref",
    { symbol: "*greeting*", package: "cl-mcp-fixture", relation: "sets" }, (r, s) => {
      expectOk(r);
      const want = placeOf(callersLines, "(defun reset-greeting").line;
      expect(s.references.length === 1 && s.references[0].line === want,
        `got ${JSON.stringify(s.references)}, file has line ${want}`);
      return `RESET-GREETING@${s.references[0].line}`;
    });

  // run-tests on the fixture's FiveAM suite: totals as FiveAM prints them, the failure at its test
  await call("asdf:load-asd of the run-tests fixture", "evaluate-lisp",
    { code: `(asdf:load-asd "${RUN_TESTS_FIXTURE}/run-tests-fixture.asd")` }, (r, s, t) => { expectOk(r); return t; });
  await call("run-tests-fixture", "run-tests", { system: "run-tests-fixture" }, (r, s, t) => {
    const tests = s.tests ?? {};
    const got = [tests.passed, tests.failed, tests.errored, tests.skipped].join("/");
    expect(r.isError === true && got === "2/1/1/1", `totals ${got}, text ${t}`);
    const failure = tests.problems?.find((p) => p.kind === "failure");
    const want = placeOf(readFileSync(join(RUN_TESTS_FIXTURE, "fiveam-suite.lisp"), "utf8").split("\n"),
      "(test doubles-wrongly");
    expect(failure?.place?.line === want.line && snippetMatchesFile(failure.place),
      `failure ${JSON.stringify(failure)}, file has line ${want.line}`);
    return `${oneLine(t.split("\n")[0])}; failure at line ${failure.place.line}`;
  }, LONG);

  // compile-file on copies of tests/fixtures/lisp/files (fasls go beside them)
  await call("warnings.lisp", "compile-file", { path: join(files, "warnings.lisp") }, (r, s) => {
    expectOk(r);
    expect(s.success === true && s.loaded === true && s.notes.length > 0, `structured ${JSON.stringify(s)}`);
    const unused = placeOf(readFileSync(join(files, "warnings.lisp"), "utf8").split("\n"), "(unused 1)");
    const note = s.notes.find((n) => n.message.includes("UNUSED"));
    expect(note && note.line === unused.line && note.column === unused.column,
      `unused-variable note at ${note && placeText(note)}, file has ${unused.line}:${unused.column}`);
    for (const n of s.notes) expect(!n.file || snippetMatchesFile(n), `snippet not at ${placeText(n)}`);
    return s.notes.map((n) => `${n.severity}@${n.line}:${n.column}`).join(" ");
  }, LONG);
  await call("clean.lisp, load false", "compile-file", { path: join(files, "clean.lisp"), load: false }, (r, s) => {
    expectOk(r);
    expect(s.success === true && s.loaded === false && s.notes.length === 0, `structured ${JSON.stringify(s)}`);
    return `fasl ${s.fasl?.replace(files, "TMP")}`;
  }, LONG);

  await call("cl-mcp-fixture:greet", "describe-symbol", { symbol: "cl-mcp-fixture:greet" }, (r, s) => {
    expectOk(r);
    expect(s.kinds?.includes("function") && s.arglist === "(NAME)", `structured ${JSON.stringify(s)}`);
    expect(s.location?.file === SHAPES && s.location.line === greet.line,
      `location ${JSON.stringify(s.location)}, file has line ${greet.line}`);
    return `${s.symbol}: ${s.kinds.join(",")} ${s.arglist} at line ${s.location.line}`;
  });
  await call("cl-mcp-fixture:circle", "describe-symbol", { symbol: "circle", package: "cl-mcp-fixture" }, (r, s) => {
    expectOk(r);
    expect(s.class?.slots?.length === 2, `structured ${JSON.stringify(s)}`);
    const circle = placeOf(shapesLines, "(defclass circle").line;
    expect(s.location?.line === circle, `location ${JSON.stringify(s.location)}, file has line ${circle}`);
    return `slots ${s.class.slots.map((x) => x.name).join(" ")}, line ${s.location.line}`;
  });
  await call("cl-mcp-fixture:*greeting*", "describe-symbol", { symbol: "cl-mcp-fixture:*greeting*" }, (r, s) => {
    expectOk(r);
    expect(s.value === "\"Hello\"", `value ${s.value}`);
    return `value ${s.value}`;
  });

  let longOutput;
  await call("100,000 lines of output", "evaluate-lisp", { code: "(dotimes (i 100000) (print i)) :done" }, (r, s) => {
    expectOk(r);
    expect(textOf(r).length <= 20000 && textOf(r).includes("left out: read-output"), "no budget marker");
    expect(textOf(r).includes("99999"), "the end of the output was lost");
    longOutput = s.number;
    return `${textOf(r).length} characters, evaluation ${s.number}`;
  });
  await call("its line 50,000", "read-output", { evaluation: longOutput, pattern: "^49999 ?$" }, (r, s) => {
    expectOk(r);
    expect(s.matches === 1 && s.lines.some((l) => /^ *50001: 49999/.test(l)), `lines ${JSON.stringify(s.lines)}`);
    return `${s.matches} match of ${s.totalLines} lines`;
  });

  // long work: an evaluation that outlives its answer window goes on in the
  // background; await-evaluation fetches its outcome, or aborts it
  let running;
  await call("(sleep 3), answer-within 1: still running", "evaluate-lisp",
    { code: "(progn (print :start) (sleep 3) :done)", "answer-within": 1 }, (r, s, t) => {
      expectOk(r);
      expect(s.running === true && Number.isInteger(s.number) && s.success === false, `structured ${JSON.stringify(s)}`);
      expect(t.startsWith(`[running] Evaluation ${s.number} is still running`), `text ${t}`);
      expect(s.follow === `await-evaluation {"evaluation": ${s.number}}`, `follow ${s.follow}`);
      running = s.number;
      return oneLine(t.split("\n")[0]);
    });
  await call("of the running evaluation", "read-output", { evaluation: running }, (r, s, t) => {
    expectOk(r);
    expect(s.evaluation === running && s.stream === "stdout" && s.lines.some((l) => l.includes(":START")),
      `structured ${JSON.stringify(s)}`);
    return oneLine(t);
  });
  await call("the running evaluation, wait 10", "await-evaluation", { evaluation: running, wait: 10 }, (r, s, t) => {
    expectOk(r);
    expect(s.success === true && !s.running && s.values?.[0] === ":DONE" && s.stdout?.includes(":START"),
      `structured ${JSON.stringify(s)}`);
    expect(t.includes("[stdout]") && t.includes(":START") && t.endsWith(`=> :DONE\n\n; Evaluation ${s.number}`), `text ${t}`);
    return oneLine(t);
  });
  await call("again: its outcome was taken", "await-evaluation", { evaluation: running }, (r) =>
    expectToolError(r, "CL-MCP:NO-SUCH-EVALUATION"));
  let sleeper;
  await call("(sleep 30), answer-within 1: still running", "evaluate-lisp",
    { code: "(sleep 30)", "answer-within": 1 }, (r, s) => {
      expectOk(r);
      expect(s.running === true && Number.isInteger(s.number), `structured ${JSON.stringify(s)}`);
      sleeper = s.number;
      return `evaluation ${sleeper} running`;
    });
  await step("await-evaluation abort: true", async () => {
    const started = Date.now();
    const r = await current.client.callTool({ name: "await-evaluation", arguments: { evaluation: sleeper, abort: true } });
    const seconds = (Date.now() - started) / 1000;
    expectOk(r);
    const s = r.structuredContent;
    expect(textOf(r) === `The evaluation was aborted.\n\n; Evaluation ${s.number}` && s.aborted === true && seconds < 10,
      `after ${seconds} s: ${textOf(r)}, structured ${JSON.stringify(s)}`);
    const { names } = await backgroundThreads((n) => n.length === 0);
    expect(names.length === 0, `background threads after the abort: ${names.join(", ")}`);
    return `${textOf(r)} (${seconds.toFixed(1)} s); no "(background)" thread left`;
  });

  await call("greet in cl-mcp-fixture", "apropos", { pattern: "greet", package: "cl-mcp-fixture" }, (r, s) => {
    expectOk(r);
    const g = s.symbols.find((x) => x.name === "GREET");
    expect(g && g.external === true && g.kinds.includes("function"), `symbols ${JSON.stringify(s.symbols)}`);
    return `${s.total} symbols: ${s.symbols.map((x) => x.name).join(" ")}`;
  });
  await call("interop-sq, functions", "apropos",
    { pattern: "interop-sq", type: "functions", "external-only": false }, (r, s) => {
      expectOk(r);
      expect(s.symbols[0]?.name === "INTEROP-SQUARE", `symbols ${JSON.stringify(s.symbols)}`);
      return `${s.total}: ${s.symbols.map((x) => `${x.package}::${x.name}`).join(" ")}`;
    });

  await call("with-doubled, one step", "macroexpand",
    { form: "(cl-mcp-fixture:with-doubled (r 3) r)" }, (r, s) => {
      expectOk(r);
      expect(s.expanded === true && /\(LET \(\(R \(\* 2 3\)\)\)/.test(s.expansion), `structured ${JSON.stringify(s)}`);
      return oneLine(s.expansion);
    });
  await call("all", "macroexpand", { form: "(when (cl-mcp-fixture:with-doubled (r 3) r) :yes)", all: true }, (r, s) => {
    expectOk(r);
    expect(s.all === true && s.expansion.startsWith("(IF"), `structured ${JSON.stringify(s)}`);
    return oneLine(s.expansion);
  });

  let circle = {};
  await call("a circle", "inspect", { code: CIRCLE }, (r, s) => {
    expectOk(r);
    expect(s.class === "CL-MCP-FIXTURE:CIRCLE" && s.parts.length === 2 && typeof s.handle === "number",
      `structured ${JSON.stringify(s)}`);
    circle = s;
    return `handle ${s.handle}, parts ${s.parts.map((p) => `${p.label}=${p.value}`).join(" ")}`;
  });
  await step("inspect by handle (a part's)", async () => {
    const r = await current.client.callTool({ name: "inspect", arguments: { handle: circle.parts[0].handle } });
    expectOk(r);
    const s = r.structuredContent;
    expect(s.printed === "\"disc\"", `structured ${JSON.stringify(s)}`);
    return `${s.class} ${s.printed}, ${s.total} parts`;
  });
  await step("inspect by handle and part", async () => {
    const r = await current.client.callTool({ name: "inspect", arguments: { handle: circle.handle, part: 1 } });
    expectOk(r);
    const s = r.structuredContent;
    expect(s.printed === "2", `structured ${JSON.stringify(s)}`);
    return `${s.class} ${s.printed}`;
  });
  await call("a long list, start 50", "inspect", { code: "(loop for i below 120 collect i)", start: 50 }, (r, s) => {
    expectOk(r);
    expect(s.start === 50 && s.total === 120 && s.parts.length === 50, `structured start ${s.start} total ${s.total}`);
    return `parts ${s.start}–${s.start + s.parts.length - 1} of ${s.total}`;
  });

  // errors that wait: invoke-restart, backtrace, eval-in-frame
  let waiting;
  await call("(+ 1 (interop-later)): undefined function", "evaluate-lisp", { code: "(+ 1 (interop-later))" }, (r, s, t) => {
    expectToolError(r, "UNDEFINED-FUNCTION");
    waiting = Number(/Evaluation (\d+) is waiting/.exec(t)?.[1]);
    expect(waiting > 0, "no waiting evaluation named");
    expect(s.success === false && s.error?.type === "UNDEFINED-FUNCTION", `structured ${JSON.stringify(s)}`);
    return `evaluation ${waiting} waits; restarts ${(s.restarts ?? []).map((x) => x.name).join(" ")}`;
  });
  await call("defun interop-later", "evaluate-lisp", { code: "(defun interop-later () 41)" }, (r) => { expectOk(r); });
  await step("invoke-restart CONTINUE", async () => {
    const r = await current.client.callTool({ name: "invoke-restart", arguments: { restart: "CONTINUE", evaluation: waiting } });
    expectOk(r);
    expect(textOf(r) === `=> 42\n\n; Evaluation ${waiting}` && r.structuredContent?.values?.[0] === "42", `result ${textOf(r)}`);
    return textOf(r);
  });
  await call("USE-VALUE with values", "evaluate-lisp", { code: "(+ 1 (interop-missing))" }, (r) => {
    expectToolError(r, "UNDEFINED-FUNCTION");
  });
  await call("USE-VALUE with values", "invoke-restart", { restart: "USE-VALUE", values: ["(lambda () 10)"] }, (r, s, t) => {
    expectOk(r);
    expect(t === `=> 11\n\n; Evaluation ${s.number}`, `text ${t}`);
    return t;
  });
  await call("inner/outer with debug 2", "evaluate-lisp", {
    code: "(defun interop-inner (a b) (declare (optimize (debug 2))) (error \"bad ~a\" (+ a b)))"
      + " (defun interop-outer (x) (declare (optimize (debug 2))) (let ((y (* 2 x))) (interop-inner x y)))",
  }, (r) => { expectOk(r); });
  await call("(interop-outer 5)", "evaluate-lisp", { code: "(interop-outer 5)" }, (r, s, t) => {
    expectToolError(r, "SIMPLE-ERROR");
    return oneLine(t.split("\n").slice(0, 2).join(" "));
  });
  let innerFrame = 1;
  await call("(newest)", "backtrace", {}, (r, s, t) => {
    expectOk(r);
    const line = t.split("\n").find((l) => /^\d+: \(INTEROP-INNER 5 10\)/.test(l));
    expect(line, `no INTEROP-INNER frame: ${t}`);
    innerFrame = Number(line.split(":")[0]);
    return `${t.split("\n")[0]}; frame ${innerFrame} is (INTEROP-INNER 5 10)`;
  });
  await call("count 2", "backtrace", { count: 2 }, (r) => { expectOk(r); });
  await step("eval-in-frame (* a b)", async () => {
    const r = await current.client.callTool({ name: "eval-in-frame", arguments: { frame: innerFrame, code: "(* a b)" } });
    expectOk(r);
    expect(textOf(r).startsWith("=> 50\n\n; Evaluation "), `text ${textOf(r)}`);
    return textOf(r);
  });
  await call("ABORT", "invoke-restart", { restart: "ABORT" }, (r, s, t) => {
    expectOk(r);
    expect(t === `The evaluation was aborted.\n\n; Evaluation ${s.number}`, `text ${t}`);
    return t;
  });

  // tool errors: results with isError, whose structuredContent is validated too
  await call("with nothing waiting", "invoke-restart", { restart: 0 }, (r) => {
    expectToolError(r, "CL-MCP:NO-SUSPENDED-EVALUATION");
  });
  await call("with nothing waiting", "backtrace", {}, (r) => { expectToolError(r, "CL-MCP:NO-SUSPENDED-EVALUATION"); });
  await call("with nothing waiting", "eval-in-frame", { frame: 0, code: "1" }, (r) => {
    expectToolError(r, "CL-MCP:NO-SUSPENDED-EVALUATION");
  });
  await call("reader error", "evaluate-lisp", { code: "(+ 1 2))" }, (r) => { expectToolError(r, "READER-ERROR"); });
  await call("unknown package", "evaluate-lisp", { code: "1", package: "interop-nope" }, (r) => {
    expectToolError(r, "PACKAGE-ERROR");
  });
  await call("read-error.lisp", "compile-file", { path: join(files, "read-error.lisp") }, (r, s) => {
    expectToolError(r, "CL-MCP:COMPILATION-FAILED");
    return s.notes?.map((n) => `${n.severity}@${n.line}:${n.column}`).join(" ");
  }, LONG);
  await call("relative path", "compile-file", { path: "relative.lisp" }, (r) => { expectToolError(r, "CL-MCP:INVALID-PATH"); });
  await call("no such system", "load-system", { system: "interop-no-such-system" }, (r) => {
    expectToolError(r, "ASDF/FIND-COMPONENT:MISSING-COMPONENT");
  }, LONG);
  await call("unknown symbol", "find-definition", { symbol: "cl-mcp-fixture::interop-nothing-here" }, (r) => {
    expectToolError(r, "CL-MCP:UNKNOWN-SYMBOL");
  });
  await call("unknown package", "xref", { symbol: "greet", package: "interop-nope" }, (r) => {
    expectToolError(r, "PACKAGE-ERROR");
  });
  await call("unknown symbol", "describe-symbol", { symbol: "cl-mcp-fixture::interop-nothing-here" }, (r) => {
    expectToolError(r, "CL-MCP:UNKNOWN-SYMBOL");
  });
  await call("unknown package", "apropos", { pattern: "x", package: "interop-nope" }, (r) => {
    expectToolError(r, "PACKAGE-ERROR");
  });
  await call("incomplete form", "macroexpand", { form: "(when" }, (r) => { expectToolError(r, "END-OF-FILE"); });
  await call("unknown handle", "inspect", { handle: 987654321 }, (r) => { expectToolError(r, "CL-MCP:UNKNOWN-HANDLE"); });
  await call("both code and handle", "inspect", { code: "1", handle: 1 }, (r) => {
    expectToolError(r, "CL-MCP:INVALID-ARGUMENTS");
  });

  // protocol errors
  await rejectedArguments("code: 1 (invalid arguments)", "evaluate-lisp", { code: 1 });
  await rejectedArguments("without its required symbol", "xref", {});
  await refused("(unknown tool)", "interop-no-such-tool", {}, ErrorCode.InvalidParams);

  // what the SDK does with progress and cancellation by default
  await step("evaluate-lisp (sleep 1.6) with onprogress", async () => {
    const seen = [];
    const r = await current.client.callTool({ name: "evaluate-lisp", arguments: { code: "(sleep 1.6) :slept" } }, undefined,
      { onprogress: (p) => seen.push(p) });
    expectOk(r);
    expect(seen.length >= 2, `${seen.length} progress notifications`);
    return `${seen.length} progress notifications, last: ${JSON.stringify(seen.at(-1))}`;
  });
  await step("evaluate-lisp (sleep 30) cancelled through an AbortSignal", async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort("interop check"), 1000);
    const started = Date.now();
    try {
      await current.client.callTool({ name: "evaluate-lisp", arguments: { code: "(sleep 30)" } }, undefined,
        { signal: controller.signal });
      throw new Mismatch("the call answered instead of being cancelled");
    } catch (error) {
      if (error instanceof Mismatch) throw error;
    }
    const r = await current.client.callTool({ name: "evaluate-lisp", arguments: { code: "(+ 20 22)" } });
    const seconds = (Date.now() - started) / 1000;
    expect(textOf(r) === `=> 42\n\n; Evaluation ${r.structuredContent?.number}` && seconds < 10, `next call ${textOf(r)} after ${seconds} s`);
    return `the next call answered ${textOf(r)}, ${seconds.toFixed(1)} s after the start`;
  });
  await tasks();

  if (!attached) {
    await call("(sb-ext:exit :code 3)", "evaluate-lisp", { code: "(sb-ext:exit :code 3)" }, (r) =>
      expectToolError(r, "CL-MCP:IMAGE-EXITING"));
    await call("after the image exited", "evaluate-lisp", { code: "(+ 2 2)" }, (r, s, t) => {
      expectOk(r);
      expect(t.startsWith("=> 4") && t.includes("[session]"), `text ${t}`);
      return t;
    });
  }
  // A name no earlier run made, so that an attached image's soft reset
  // counts it as this session's (docs/attach.md)
  const fresh = `INTEROP-FRESH-${process.pid}-${Date.now()}`;
  await call(`defun ${fresh.toLowerCase()}`, "evaluate-lisp", { code: `(defun ${fresh.toLowerCase()} () t)` }, (r) => expectOk(r));
  await call("", "reset-session", {}, (r, s, t) => {
    expectOk(r);
    expect(t === "Session reset. All definitions cleared.", `text ${t}`);
    return t;
  }, LONG);
  await call("after reset", "list-definitions", {}, (r, s, t) => {
    expectOk(r);
    if (!attached) {
      expect(t === "No definitions in the current session.", `text ${t}`);
      return t;
    }
    // Attached, the reset is soft: it removes the CL-USER symbols evaluations
    // created (docs/attach.md); not those that existed before (an earlier run
    // against the same image), nor what compile-file loaded.
    const names = (s.definitions ?? []).map((d) => d.name);
    expect(!names.includes(fresh), `${fresh} is still listed: ${names}`);
    return names.length ? `soft reset; still listed: ${names.join(" ")}` : t;
  });
  await call("after reset", "evaluate-lisp", { code: `(find-symbol "${fresh}")` }, (r, s, t) => {
    expectOk(r);
    expect(t === `=> NIL\n=> NIL\n\n; Evaluation ${r.structuredContent?.number}`, `text ${t}`);
    return oneLine(t);
  });
  await step("notifications received", async () => {
    const counts = {};
    for (const n of current.transport.notifications) counts[n.method] = (counts[n.method] ?? 0) + 1;
    return `${JSON.stringify(counts)}; ${current.logMessages.length} log messages`;
  });
}

/** The first message of callToolStream for a task-augmented call of NAME
 * with ARGS: the SDK sends tools/call with params.task and yields
 * `taskCreated` with the server's CreateTaskResult.  The stream is closed
 * there, so that the steps poll the task themselves. */
async function createTask(name, args, ttl = 600_000) {
  const stream = current.client.experimental.tasks.callToolStream(
    { name, arguments: args }, CallToolResultSchema, { task: { ttl } });
  const first = await stream.next();
  await stream.return();
  const message = first.value;
  if (message?.type === "error") throw message.error;
  expect(message?.type === "taskCreated", `first message ${JSON.stringify(message)}`);
  return message.task;
}

/** tasks/get until the task ends (or LIMIT ms pass); the statuses seen. */
async function pollTask(taskId, limit = 60_000) {
  const seen = [];
  const started = Date.now();
  for (;;) {
    const task = await current.client.experimental.tasks.getTask(taskId);
    if (seen.at(-1) !== task.status) seen.push(task.status);
    if (["completed", "failed", "cancelled"].includes(task.status)) return { task, seen };
    expect(Date.now() - started < limit, `still ${task.status} after ${limit} ms`);
    await new Promise((r) => setTimeout(r, Math.min(task.pollInterval ?? 500, 500)));
  }
}

/** MCP tasks through the SDK's experimental API (client.experimental.tasks):
 * cl-mcp has them under 2025-11-25 only. */
async function tasks() {
  const version = current.transport.protocolVersion;
  if (version !== TASKS_VERSION) {
    await step("tasks", async () => `skipped: no tasks under ${version}`);
    return;
  }
  await step("tasks: callToolStream evaluate-lisp (* 6 7)", async () => {
    const types = [];
    let final;
    // No options: the SDK makes a task of it by itself, since the tool's
    // taskSupport is "optional" and the server has tasks.requests.tools.call
    for await (const message of current.client.experimental.tasks.callToolStream({ name: "evaluate-lisp", arguments: { code: "(* 6 7)" } })) {
      types.push(message.type);
      if (message.type === "result") final = message.result;
      if (message.type === "error") throw message.error;
    }
    expect(types[0] === "taskCreated" && types.at(-1) === "result", `messages ${types.join(" ")}`);
    expect(final && textOf(final) === `=> 42\n\n; Evaluation ${final.structuredContent?.number}` && final.structuredContent?.values?.[0] === "42", `result ${JSON.stringify(final)}`);
    return `messages: ${types.join(" ")}; ${textOf(final)}`;
  });

  let adder;
  await step("tasks: evaluate-lisp (progn (sleep 2) (+ 1 2)) as a task", async () => {
    adder = await createTask("evaluate-lisp", { code: "(progn (sleep 2) (+ 1 2))" });
    expect(adder.status === "working" && typeof adder.taskId === "string" && adder.ttl === 600_000,
      `task ${JSON.stringify(adder)}`);
    return `task ${adder.taskId.slice(0, 8)}…, ${adder.status}, ttl ${adder.ttl}, pollInterval ${adder.pollInterval}`;
  });
  await step("evaluate-lisp meanwhile", async () => {
    const started = Date.now();
    const r = await current.client.callTool({ name: "evaluate-lisp", arguments: { code: "(+ 20 22)" } });
    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    expectOk(r);
    expect(textOf(r) === `=> 42\n\n; Evaluation ${r.structuredContent?.number}`, `text ${textOf(r)}`);
    const task = await current.client.experimental.tasks.getTask(adder.taskId);
    expect(task.status === "working", `the task is ${task.status} by then (the call took ${seconds} s)`);
    return `${textOf(r)} in ${seconds} s, the task still ${task.status}`;
  });
  await step("tasks/get until it ends", async () => {
    const { task, seen } = await pollTask(adder.taskId);
    expect(task.status === "completed", `status ${task.status}: ${task.statusMessage}`);
    return `statuses ${seen.join(" → ")}`;
  });
  await step("tasks/result (getTaskResult)", async () => {
    const r = await current.client.experimental.tasks.getTaskResult(adder.taskId, CallToolResultSchema);
    expectOk(r);
    const s = r.structuredContent;
    expect(textOf(r) === `=> 3\n\n; Evaluation ${s?.number}` && s?.values?.[0] === "3", `result ${JSON.stringify(r)}`);
    // getTaskResult checks the CallToolResult's shape only; the outputSchema
    // is checked here with the SDK's validator, as callTool would
    const valid = current.outputValidators.get("evaluate-lisp")(s);
    expect(valid.valid, `structuredContent does not match evaluate-lisp's outputSchema: ${valid.errorMessage}`);
    expect(r._meta?.[RELATED_TASK_META_KEY]?.taskId === adder.taskId, `_meta ${JSON.stringify(r._meta)}`);
    return `${textOf(r)}, structuredContent valid, _meta related-task ${adder.taskId.slice(0, 8)}…`;
  });
  await step("tasks/list (listTasks)", async () => {
    const listed = await current.client.experimental.tasks.listTasks();
    const mine = listed.tasks.find((t) => t.taskId === adder.taskId);
    expect(mine?.status === "completed", `tasks ${JSON.stringify(listed.tasks)}`);
    return `${listed.tasks.length} tasks: ${listed.tasks.map((t) => t.status).join(" ")}${listed.nextCursor ? ", more" : ""}`;
  });

  // A tool error makes the task failed (docs/tools.md#tasks); callToolStream
  // then yields only "Task ID failed", and tasks/result has the result
  let failed;
  await step("tasks: callToolStream (error \"interop boom\")", async () => {
    const types = [];
    let last;
    for await (const message of current.client.experimental.tasks.callToolStream(
      { name: "evaluate-lisp", arguments: { code: "(error \"interop boom\")" } })) {
      types.push(message.type);
      if (message.type === "taskCreated") failed = message.task.taskId;
      last = message;
    }
    expect(types[0] === "taskCreated" && last.type === "error", `messages ${types.join(" ")}`);
    const task = await current.client.experimental.tasks.getTask(failed);
    expect(task.status === "failed", `task ${JSON.stringify(task)}`);
    return `messages: ${types.join(" ")}: ${last.error.message}; tasks/get: ${task.status}`;
  });
  await step("tasks/result of the failed task", async () => {
    const r = await current.client.experimental.tasks.getTaskResult(failed, CallToolResultSchema);
    expectToolError(r, "SIMPLE-ERROR");
    const valid = current.outputValidators.get("evaluate-lisp")(r.structuredContent);
    expect(valid.valid, `structuredContent does not match evaluate-lisp's outputSchema: ${valid.errorMessage}`);
    expect(r.structuredContent?.error?.message === "interop boom", `structured ${JSON.stringify(r.structuredContent)}`);
    return oneLine(textOf(r).split("\n").slice(0, 2).join(" "));
  });
  await call("ABORT (the failed task's evaluation waits)", "invoke-restart", { restart: "ABORT" }, (r, s, t) => {
    expectOk(r);
    expect(t === `The evaluation was aborted.\n\n; Evaluation ${s.number}`, `text ${t}`);
    return t;
  });

  let sleeper;
  await step("tasks: evaluate-lisp (sleep 30) as a task", async () => {
    sleeper = await createTask("evaluate-lisp", { code: "(sleep 30)" });
    // a task runs with an answer window of 1 s, then in the background
    const { names } = await backgroundThreads((n) => n.length > 0);
    expect(names.length === 1, `background threads: ${names.join(", ") || "none"}`);
    const task = await current.client.experimental.tasks.getTask(sleeper.taskId);
    expect(task.status === "working", `task ${JSON.stringify(task)}`);
    return `${task.status}${task.statusMessage ? ", " + task.statusMessage : ""}; thread "${names[0]}"`;
  });
  await step("tasks/cancel (cancelTask)", async () => {
    const cancelled = await current.client.experimental.tasks.cancelTask(sleeper.taskId);
    expect(cancelled.status === "cancelled", `answer ${JSON.stringify(cancelled)}`);
    const task = await current.client.experimental.tasks.getTask(sleeper.taskId);
    expect(task.status === "cancelled", `tasks/get then: ${JSON.stringify(task)}`);
    return `cancelTask answered ${cancelled.status}; tasks/get: ${task.status}`;
  });
  await step("tasks/cancel again: it has ended", async () => {
    try {
      const again = await current.client.experimental.tasks.cancelTask(sleeper.taskId);
      throw new Mismatch(`no error: ${JSON.stringify(again)}`);
    } catch (error) {
      if (error instanceof Mismatch) throw error;
      expect(error instanceof McpError && error.code === ErrorCode.InvalidParams, `${error}`);
      return `${error.code} ${error.message}`;
    }
  });
  await step("after the cancel: no evaluation left in the background", async () => {
    const { names, seconds } = await backgroundThreads((n) => n.length === 0);
    expect(names.length === 0, `background threads ${seconds} s after the cancel: ${names.join(", ")}`);
    return `no "(background)" thread, ${seconds} s after`;
  });
}

/** The names of the image's threads that run a background evaluation
 * ("cl-mcp evaluation N (background)", docs/tools.md), asked until WANTED
 * holds of them or 5 s have passed. */
async function backgroundThreads(wanted) {
  const code = "(remove-if-not (lambda (name) (search \"(background)\" name))"
    + " (mapcar #'sb-thread:thread-name (sb-thread:list-all-threads)))";
  const started = Date.now();
  for (;;) {
    const r = await current.client.callTool({ name: "evaluate-lisp", arguments: { code } });
    expectOk(r);
    const names = [...textOf(r).matchAll(/"([^"]*)"/g)].map((m) => m[1]);
    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    if (wanted(names) || Date.now() - started > 5000) return { names, seconds };
    await new Promise((resolveLater) => setTimeout(resolveLater, 250));
  }
}

/** Each tool once more, against a cl-mcp that has no image to talk to: every
 * call is a session error (TYPE), and the SDK checks that result's
 * structuredContent against the tool's outputSchema too. */
async function sessionErrors(files, type) {
  await current.client.listTools();
  const good = {
    "evaluate-lisp": { code: "(+ 1 2)" }, "invoke-restart": { restart: 0 }, "backtrace": {},
    "eval-in-frame": { frame: 0, code: "1" }, "list-definitions": {}, "reset-session": {},
    "load-system": { system: "cl-mcp-fixture" }, "xref": { symbol: "car" },
    "compile-file": { path: join(files, "clean.lisp") },
    "compile-form": { path: join(files, "clean.lisp"), line: 1 }, "apropos": { pattern: "car" },
    "macroexpand": { form: "(when t 1)" }, "inspect": { code: "1" },
    "find-definition": { symbol: "car" }, "describe-symbol": { symbol: "car" },
    "threads": { action: "list" }, "profile": { code: "1" },
    "await-evaluation": { evaluation: 1 }, "run-tests": { system: "cl-mcp-fixture" },
    "edit-form": { path: join(files, "clean.lisp"), line: 1, text: "(defun clean () 1)" },
    "read-lisp-file": { path: join(files, "clean.lisp") },
  };
  for (const name of TOOLS.filter((each) => each !== "read-output")) { // it needs no image
    await call(`(${type})`, name, good[name], (r) => expectToolError(r, type));
  }
}

/** A TCP port on 127.0.0.1 that nothing listens on (just now). */
function closedPort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

/** ARGS for a cl-mcp without an image: attached to a closed port, or
 * embedded with an SBCL that does not exist. */
async function imagelessArgs(args, attached, files) {
  if (!attached) return { args: [...args, "--sbcl", join(files, "no-such-sbcl")], type: "CL-MCP:IMAGE-START-FAILED" };
  const port = await closedPort();
  const out = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--connect") { out.push(args[i], `127.0.0.1:${port}`); i++; }
    else if (args[i].startsWith("--connect=")) out.push(`--connect=127.0.0.1:${port}`);
    else out.push(args[i]);
  }
  return { args: out, type: "CL-MCP:NOT-CONNECTED" };
}

const files = mkdtempSync(join(tmpdir(), "cl-mcp-interop-"));
for (const name of ["clean.lisp", "warnings.lisp", "read-error.lisp"]) {
  copyFileSync(join(FIXTURES, "files", name), join(files, name));
}
const { command, args } = serverCommand();
const attached = args.some((a) => a === "--connect" || a.startsWith("--connect="));
console.log(`# @modelcontextprotocol/sdk ${SDK_VERSION} (latest protocol ${LATEST_PROTOCOL_VERSION}), node ${process.version}`);
const stderrs = [];
try {
  console.log(`# server: ${[command, ...args].join(" ")}`);
  const main = newSession(command, args);
  if (await connect(main)) await everyTool(files, attached);
  await close(main);
  stderrs.push(main.stderr);
  const imageless = await imagelessArgs(args, attached, files);
  console.log(`# server: ${[command, ...imageless.args].join(" ")}`);
  const broken = newSession(command, imageless.args);
  if (await connect(broken)) await sessionErrors(files, imageless.type);
  await close(broken);
  stderrs.push(broken.stderr);
} finally {
  rmSync(files, { recursive: true, force: true });
}

if (failures > 0) {
  // cl-mcp's own errors, if it logged any (a traceback's lines have no level)
  const lines = stderrs.join("\n").split("\n").filter((l) => l.trim() && !/ cl-mcp (DEBUG|INFO|WARNING) /.test(l));
  if (lines.length) console.log(`# cl-mcp's stderr, errors:\n${lines.slice(-15).join("\n").replace(/^/gm, "#   ")}`);
  console.log(`# ${failures} FAILED`);
  process.exit(1);
}
console.log("# all ok");
