// The chat page of tfm-serve: keeps the conversation, streams each answer from this server's
// /v1/chat/completions (server-sent events) and shows the live decoding statistics that the
// server puts on every chunk (x_tfm, asked for with stream_options.x_tfm_live).
// Model output is only ever set as text (text nodes), never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

const chat = {
  model: null,        // the served model id (GET health)
  messages: [],       // the conversation: {role, content}
  controller: null,   // the AbortController of the answer streaming now
};

// -- rendering ------------------------------------------------------------------------------------

// Fill `el` with `text` as text nodes: prose in spans, fenced code blocks (``` lines) in <pre><code>,
// the fence lines themselves in dimmed spans, so that el.textContent === text.
function renderText(el, text) {
  const parts = [];
  let code = null;   // the <code> of the open fence, if any
  let prose = null;  // the prose span being filled
  for (const line of text.split(/(?<=\n)/)) {
    if (/^\s*```/.test(line)) {
      const fence = document.createElement("span");
      fence.className = "fence";
      fence.textContent = line;
      parts.push(fence);
      prose = null;
      if (code === null) {
        const pre = document.createElement("pre");
        code = document.createElement("code");
        pre.append(code);
        parts.push(pre);
      } else {
        code = null;
      }
    } else if (code !== null) {
      code.append(document.createTextNode(line));
    } else {
      if (prose === null) {
        prose = document.createElement("span");
        parts.push(prose);
      }
      prose.append(document.createTextNode(line));
    }
  }
  el.replaceChildren(...parts);
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  const content = document.createElement("div");
  content.className = "content";
  renderText(content, text);
  div.append(content);
  $("log").append(div);
  scrollDown();
  return div;
}

function scrollDown() {
  const log = $("log");
  log.scrollTop = log.scrollHeight;
}

function showError(text) {
  const el = $("error");
  el.textContent = text;
  el.hidden = !text;
}

const fmt = (x, digits) => (x == null ? "–" : Number(x).toFixed(digits));

// x_tfm: {tau, tokens_per_s, plain_tokens_per_s, speedup, completion_tokens} (docs/chat-page.md)
function showStats(x) {
  $("stat-tau").textContent = `τ ${fmt(x.tau, 2)}`;
  $("stat-tps").textContent = `${fmt(x.tokens_per_s, 1)} tok/s`;
  $("stat-speedup").textContent = `${fmt(x.speedup, 2)}× plain`;
}

function setState(state) {
  document.body.dataset.state = state;  // loading | idle | busy
  $("send").disabled = state !== "idle";
  $("stop").disabled = state !== "busy";
}

// -- the API --------------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The message of an error answer (OpenAI's {"error": {"message"}} body), with a hint for a 401.
async function errorText(response) {
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (e) { /* not JSON */ }
  if (response.status === 401) {
    $("settings").open = true;
    message += " (enter the key under Settings)";
  }
  return message;
}

// The data of each server-sent event of `response`, as strings.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    // a "\r" at the end may be the first half of "\r\n": keep it for the next read
    const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
    const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
    buffer = lines.pop() + buffer.slice(cut);
    for (const line of lines) {
      if (line === "") {
        if (data.length) yield data.join("\n");
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
    }
  }
  if (data.length) yield data.join("\n");
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.messages);
  const body = { model: chat.model, messages, stream: true, stream_options: { x_tfm_live: true } };
  const temperature = parseFloat($("temperature").value);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (Number.isInteger(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

async function send() {
  const input = $("input");
  const text = input.value;
  if (!text.trim() || document.body.dataset.state !== "idle") return;
  showError("");
  input.value = "";
  const conversation = chat.messages;  // "New chat" during the answer starts another array
  conversation.push({ role: "user", content: text });
  const question = addMessage("user", text);
  const bubble = addMessage("assistant", "");
  const content = bubble.querySelector(".content");
  let answer = "";
  let finished = false;  // the stream ended as the API ends it ([DONE])
  showStats({});
  const controller = new AbortController();
  chat.controller = controller;
  setState("busy");
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const data of sseData(response)) {
      if (data === "[DONE]") {
        finished = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.delta && choice.delta.content) {
        answer += choice.delta.content;
        renderText(content, answer);
        scrollDown();
      }
      if (chunk.x_tfm) showStats(chunk.x_tfm);
    }
  } catch (e) {
    if (controller.signal.aborted) {
      bubble.classList.add("stopped");
    } else {
      showError(e.message || String(e));
    }
  } finally {
    chat.controller = null;
    if (answer || finished) {
      renderText(content, answer);
      if (!answer) bubble.classList.add("empty");  // the model ended its answer at once
      conversation.push({ role: "assistant", content: answer });
    } else {
      // nothing came back (an error, or stopped at once): the question is taken back into the input
      question.remove();
      bubble.remove();
      conversation.pop();
      if (conversation === chat.messages && !input.value) input.value = text;
    }
    setState("idle");
  }
}

function stop() {
  if (chat.controller) chat.controller.abort();
}

function newChat() {
  stop();
  chat.messages = [];
  $("log").replaceChildren();
  showError("");
}

async function start() {
  try {
    const response = await fetch("health");
    const health = await response.json();
    chat.model = health.model;
    $("model").textContent = health.model;
    setState("idle");
  } catch (e) {
    showError(`The server did not answer /health: ${e.message || e}`);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  setState("loading");
  start();
});
