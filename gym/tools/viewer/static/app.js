// harnessrl view: the page. Hash routes: #/run/R (runs page + episodes table),
// #/run/R/episode/SID (one episode: conversation beside the token view), #/compare.
// Everything comes from this server's /api, one page at a time.
"use strict";

const $main = document.getElementById("main");
const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777"];
const TOKEN_AUTOLOAD = 20000;  // tokens per segment fetched without asking (then "load more")
let RUNS = [];

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    e.appendChild(typeof kid === "string" || typeof kid === "number" ? document.createTextNode(String(kid)) : kid);
  }
  return e;
}

async function api(path) {
  const r = await fetch(path);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

function showError(e) {
  $main.replaceChildren(h("p", {class: "error"}, String(e.message || e)));
}

const fmt = v => (v === null || v === undefined) ? "-" : (typeof v === "number" ? fmtNum(v) : String(v));
const secs = v => (v === null || v === undefined) ? "-" : `${v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s"}`;

// ---- runs nav --------------------------------------------------------------------------
function renderNav() {
  const nav = document.getElementById("runs-nav");
  nav.replaceChildren(...RUNS.map(r => h("a", {href: `#/run/${r.run}`, class: "run-link"},
                                        `${r.name} (${r.episodes})`)));
  if (RUNS.length > 1) nav.appendChild(h("a", {href: "#/compare", class: "run-link"}, "compare"));
}

// ---- runs page -------------------------------------------------------------------------
async function runPage(r) {
  const s = await api(`/api/runs/${r}/summary`);
  const pts = s.curve.points;
  const charts = h("div", {class: "charts"},
    lineChart([{name: "reward", color: COLORS[0], points: pts.map(p => [p.x, p.reward])},
               {name: "success", color: COLORS[2], points: pts.map(p => [p.x, p.success])}],
              {title: s.curve.x === "step" ? "reward and success rate per step"
                                           : `reward and success (running mean of ${s.curve.window})`,
               xLabel: s.curve.x, yMin: 0}),
    barChart(Object.keys(s.staleness_hist).map(k => `lag ${k}`), Object.values(s.staleness_hist),
             {title: "staleness: sampled tokens per version lag", xLabel: "policy versions behind"}),
    histChart(s.env_latency_s, {title: "env latency per turn", xLabel: "seconds"}),
    histChart(s.model_call_latency_s, {title: "model-call latency", xLabel: "seconds (queue + generation)"}));
  const cheat = s.cheat || {points: [], totals: null};
  if (cheat.points.length)  // a train run's steps: the share of tampered episodes, the canaries passed
    charts.appendChild(lineChart(
      [{name: "tampered", color: COLORS[1], points: cheat.points.map(p => [p.x, p.tampered_frac])},
       {name: "canary pass", color: COLORS[3], points: cheat.points.map(p => [p.x, p.canary_pass_rate])}],
      {title: "cheat rate per step", xLabel: "step", yMin: 0, yMax: 1}));
  const cards = h("div", {class: "cards"},
    card("episodes", s.episodes), card("scored", s.scored), card("success rate", fmt(s.success_rate)),
    card("reward mean", fmt(s.reward_mean)),
    ...Object.entries(s.by_status).map(([k, v]) => card(k, v)));
  const table = h("section", {id: "episodes-section"});
  $main.replaceChildren(h("h1", {}, `run: ${s.name}`), h("p", {class: "muted"}, `${s.kind} run at ${s.root}`),
                        cards, charts, h("h2", {}, "harnesses"), harnessTable(s.by_harness, r),
                        h("h2", {}, "cheat rate"), cheatTable(cheat.totals),
                        h("h2", {}, "episodes"), table, h("h2", {}, "run report"),
                        reportTable(s.report));
  await episodesTable(r, table);
}

function card(label, value) {
  return h("div", {class: "card"}, h("div", {class: "card-value"}, String(value)), h("div", {class: "card-label"}, label));
}

function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
    else out.push([key, Array.isArray(v) ? JSON.stringify(v) : v]);
  }
  return out;
}

// One row per harness of the run (several in a mixed run); its name filters the episodes table to it.
function harnessTable(rows, r) {
  const head = ["harness", "episodes", "scored", "success rate", "reward mean", "sampled tokens", "infra errors",
                "harness crashed"];
  return h("table", {id: "harnesses"}, h("thead", {}, h("tr", {}, head.map(x => h("th", {}, x)))),
    h("tbody", {}, (rows || []).map(x => h("tr", {"data-harness": x.harness},
      h("td", {}, h("a", {href: "#episodes-section", class: "harness-filter", onclick: ev => {
        ev.preventDefault();  // the episodes table below, filtered to this harness
        const st = TABLE_STATE[r];
        if (st) { st.f = {...st.f, harness: x.harness}; st.offset = 0; }
        episodesTable(r, document.getElementById("episodes-section"));
      }}, x.harness || "-")),
      h("td", {class: "num"}, x.episodes), h("td", {class: "num"}, x.scored), h("td", {class: "num"}, fmt(x.success_rate)),
      h("td", {class: "num"}, fmt(x.reward_mean)), h("td", {class: "num"}, x.sampled_tokens),
      h("td", {class: "num"}, x.infra_errors), h("td", {class: "num"}, x.harness_crashed)))));
}

// The cheat rate's totals: tampered episodes (all, then by kind, zeros included) and canaries passed k/n.
function cheatTable(t) {
  if (!t) return h("p", {class: "muted", id: "cheat"}, "no cheat rate recorded in this run");
  const frac = t.tampered_frac === null ? "" : ` (${fmt(t.tampered_frac)})`;
  const rows = [["tampered episodes", `${t.tampered_episodes}/${t.graded_episodes} graded${frac}`],
                ...Object.entries(t.tampered_by_kind).map(([k, n]) => [`tampered: ${k}`, n]),
                ["canaries passed", `${t.canary.k_of_n}` + (t.canary.pass_rate === null ? "" : ` (${fmt(t.canary.pass_rate)})`)]];
  return h("table", {id: "cheat", class: "kv"}, h("tbody", {}, rows.map(([k, v]) =>
    h("tr", {"data-key": k}, h("th", {}, k), h("td", {}, String(v))))));
}

function reportTable(report) {
  if (!report) return h("p", {class: "muted"}, "no report.json in this run");
  const rows = flatten(report, "", []);
  return h("table", {id: "report", class: "kv"}, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k),
                                                                                       h("td", {}, fmt(v))))));
}

const COLUMNS = [["order", "#"], ["task_id", "task"], ["harness", "harness"], ["reward", "reward"],
                 ["status", "status"], ["termination", "termination"], ["calls", "calls"],
                 ["segments", "segments"], ["tokens", "tokens"], ["sampled", "sampled"]];
const TABLE_STATE = {};

async function episodesTable(r, root) {
  const st = TABLE_STATE[r] || (TABLE_STATE[r] = {limit: 50, offset: 0, sort: "order", desc: false, f: {}});
  const menus = await api(`/api/runs/${r}/filters`);
  const input = (name, placeholder) => h("input", {name, placeholder, value: st.f[name] || "", size: 14});
  const select = name => h("select", {name}, h("option", {value: ""}, `${name}: any`),
    menus[name].map(v => h("option", {value: v, selected: st.f[name] === v ? "selected" : null}, v)));
  const form = h("form", {class: "filters", id: "episode-filters"},
    input("task", "task contains"), select("harness"), select("status"), select("termination"),
    input("split", "split reason"), input("min_reward", "reward ≥"), input("max_reward", "reward ≤"),
    h("button", {type: "submit"}, "filter"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    st.f = Object.fromEntries([...new FormData(form)].filter(([, v]) => v !== ""));
    st.offset = 0;
    load();
  });
  const body = h("tbody");
  const head = h("tr", {}, COLUMNS.map(([key, label]) => h("th", {
    class: "sortable", "data-sort": key,
    onclick: () => { st.desc = st.sort === key ? !st.desc : false; st.sort = key; st.offset = 0; load(); },
  }, label)));
  const pager = h("div", {class: "pager"});
  const table = h("table", {id: "episodes", class: "grid"}, h("thead", {}, head), body);
  root.replaceChildren(form, table, pager);

  async function load() {
    const q = new URLSearchParams({limit: st.limit, offset: st.offset, sort: st.sort, desc: st.desc, ...st.f});
    let page;
    try { page = await api(`/api/runs/${r}/episodes?${q}`); }
    catch (e) { pager.replaceChildren(h("span", {class: "error"}, e.message)); return; }
    for (const th of head.children) {
      th.classList.toggle("sorted", th.dataset.sort === st.sort);
      th.dataset.dir = th.dataset.sort === st.sort ? (st.desc ? "desc" : "asc") : "";
    }
    body.replaceChildren(...page.rows.map((e, i) => h("tr", {"data-sid": e.sid, class: `status-${e.status}`},
      h("td", {}, String(page.offset + i + 1)),
      h("td", {}, h("a", {href: `#/run/${r}/episode/${encodeURIComponent(e.sid)}`, class: "episode-link"}, e.task_id || e.sid)),
      h("td", {}, e.harness), h("td", {class: "num"}, fmt(e.reward)), h("td", {}, e.status),
      h("td", {}, e.termination), h("td", {class: "num"}, e.calls),
      h("td", {class: "num", title: e.splits.join(", ")}, e.segments + (e.splits.length ? " ✂" : "")),
      h("td", {class: "num"}, e.tokens), h("td", {class: "num"}, e.sampled))));
    const end = Math.min(page.total, page.offset + page.rows.length);
    pager.replaceChildren(
      h("button", {disabled: st.offset === 0 ? "disabled" : null,
                   onclick: () => { st.offset = Math.max(0, st.offset - st.limit); load(); }}, "‹ prev"),
      h("span", {class: "page-info"}, `${page.total ? page.offset + 1 : 0}–${end} of ${page.total}`),
      h("button", {disabled: end >= page.total ? "disabled" : null,
                   onclick: () => { st.offset += st.limit; load(); }}, "next ›"),
      h("select", {onchange: ev => { st.limit = +ev.target.value; st.offset = 0; load(); }},
        [25, 50, 100, 200, 500].map(n => h("option", {value: n, selected: n === st.limit ? "selected" : null},
                                            `${n} a page`))));
  }
  await load();
}

// ---- one episode -----------------------------------------------------------------------
async function episodePage(r, sid) {
  const ep = await api(`/api/runs/${r}/episodes/${encodeURIComponent(sid)}`);
  const g = ep.grading || {};
  const conv = h("div", {id: "conversation", class: "pane"});
  const tokens = h("div", {id: "token-view", class: "pane", "data-loaded": "false"});
  const colorBy = h("select", {id: "color-by", onchange: ev => tokens.dataset.color = ev.target.value},
                    h("option", {value: "logprob"}, "sampled tokens: logprob heat"),
                    h("option", {value: "version"}, "sampled tokens: policy version"));
  tokens.dataset.color = "logprob";
  $main.replaceChildren(
    h("p", {}, h("a", {href: `#/run/${r}`}, `‹ ${RUNS[r] ? RUNS[r].name : "run"}`)),
    h("h1", {}, ep.task_id || ep.session_id),
    h("div", {class: "cards"}, card("reward", fmt(ep.reward)), card("status", ep.status),
      card("termination", ep.termination || "-"), card("calls", ep.n_calls), card("segments", ep.segments.length),
      card("sampled tokens", ep.sampled_total), card("harness", ep.harness || "-"), card("model", ep.model || "-")),
    h("p", {class: "muted"}, `session ${ep.session_id} · chat template ${ep.chat_template_hash || "-"} · `,
      ep.decoded_with ? `decoded with ${ep.decoded_with}'s tokenizer` : (ep.decode_note || "")),
    h("div", {class: "legend-row"}, h("span", {class: "tok"}, "prompt token"), " ",
      h("span", {class: "tok sampled", style: `background:${heat(0)}`}, "sampled, logprob 0"), " ",
      h("span", {class: "tok sampled", style: `background:${heat(-6)}`}, "-6"), " ",
      h("span", {class: "tok sampled", style: `background:${heat(HEAT_FLOOR)}`}, `≤ ${HEAT_FLOOR}`), " ", colorBy),
    h("div", {class: "episode-panes"}, conv, tokens),
    grading(g, ep.metadata));
  await Promise.all([loadCalls(r, sid, conv, 0), loadTokens(r, sid, ep, tokens)]);
}

function grading(g, meta) {
  const kids = [h("h2", {}, "grading")];
  kids.push(h("p", {id: "grading-reason"}, g.reason || (meta && meta.error) || "no grading record"));
  if (g.tests && g.tests.length) {
    kids.push(h("table", {class: "grid", id: "tests"}, h("tbody", {}, g.tests.map(t =>
      h("tr", {class: `test-${t.status}`}, h("td", {}, t.node_id), h("td", {}, t.kind), h("td", {}, t.status))))));
  }
  const det = (title, id, text) => h("details", {open: "open"}, h("summary", {}, title), h("pre", {id}, text));
  if (g.agent_diff !== undefined) {
    const more = g.agent_diff_chars > g.agent_diff.length ? ` (first ${g.agent_diff.length} of ${g.agent_diff_chars} chars)` : "";
    kids.push(det(`the agent's patch${more}`, "patch", g.agent_diff || "(no changes)"));
  } else if (g.reason) {
    kids.push(h("p", {class: "muted"}, "this record keeps no patch (recorded before patches were kept)"));
  }
  if (g.test_output !== undefined) kids.push(det("hidden tests' output", "test-output", g.test_output || "(empty)"));
  if (meta && meta.timings) {
    kids.push(h("p", {class: "muted"}, "timings: " + Object.entries(meta.timings).map(([k, v]) => `${k} ${secs(v)}`).join(" · ")));
  }
  return h("section", {id: "grading"}, kids);
}

async function loadCalls(r, sid, conv, offset) {
  const page = await api(`/api/runs/${r}/episodes/${encodeURIComponent(sid)}/calls?offset=${offset}&limit=50`);
  const more = conv.querySelector(".more-calls");
  if (more) more.remove();
  for (const c of page.calls) conv.appendChild(callView(c));
  if (page.offset + page.calls.length < page.total) {
    conv.appendChild(h("button", {class: "more-calls", onclick: () => loadCalls(r, sid, conv, page.offset + page.limit)},
                       `more calls (${page.offset + page.calls.length} of ${page.total})`));
  }
}

function callView(c) {
  const head = h("div", {class: "call-head"}, h("b", {}, `call ${c.index}`),
    ` · segment ${c.segment} · ${c.dialect} · ${c.finish_reason} · prompt ${c.prompt_tokens} (${c.prefix_reused} reused)`,
    ` · sampled ${c.completion_tokens} · queue ${secs(c.queue_s)} · generation ${secs(c.gen_s)}`,
    ` · env before ${secs(c.env_s)}`, c.versions.length ? ` · version ${c.versions.join(",")}` : "");
  const kids = [head, timeBar(c)];
  if (c.starts_segment && c.split_reason) {
    kids.push(h("div", {class: "split-banner"}, "new segment: ", h("span", {class: "split-reason"}, c.split_reason)));
  }
  if (c.detached) kids.push(h("div", {class: "detached"}, `detached (${c.detached}): extends no segment, never trained`));
  for (const m of c.messages) kids.push(message(m.role, m.content));
  if (c.reply !== null) {
    const reply = message("assistant", c.reply);
    reply.classList.add("reply");
    kids.push(reply);
  }
  for (const tc of c.tool_calls) {
    kids.push(h("div", {class: "tool-call"}, h("span", {class: "role"}, `tool call: ${tc.name}`),
                h("pre", {}, typeof tc.arguments === "string" ? tc.arguments : JSON.stringify(tc.arguments, null, 1))));
  }
  return h("div", {class: "call", "data-call": c.index}, kids);
}

// Where this turn's time went: the harness/env before the call, queueing, generation.
function timeBar(c) {
  const parts = [["env", c.env_s || 0], ["queue", c.queue_s || 0], ["gen", c.gen_s || 0]];
  const total = parts.reduce((a, [, v]) => a + v, 0) || 1;
  return h("div", {class: "timebar", title: parts.map(([k, v]) => `${k} ${secs(v)}`).join(" · ")},
           parts.filter(([, v]) => v > 0).map(([k, v]) =>
             h("span", {class: `tb-${k}`, "data-part": k, style: `width:${(100 * v / total).toFixed(2)}%`})));
}

function message(role, content) {
  return h("div", {class: `msg role-${role.replace(/[^a-z]/gi, "")}`, "data-role": role},
           h("div", {class: "role"}, role), h("pre", {class: "content"}, content));
}

async function loadTokens(r, sid, ep, root) {
  for (const seg of ep.segments) {
    const box = h("div", {class: "segment", "data-segment": seg.index});
    const headKids = [h("b", {}, `segment ${seg.index}`), ` · ${seg.n_tokens} tokens · ${seg.sampled} sampled`];
    if (seg.split_reason) headKids.push(" · split: ", h("span", {class: "split-reason"}, seg.split_reason));
    const sp = seg.spawned_by;
    if (sp) headKids.push(h("span", {class: "spawned-by"}, ` · spawned by segment ${sp.segment}'s ${sp.tool || "tool"} call` +
                                                           (sp.call_id ? ` (${sp.call_id})` : "")));
    const cf = seg.compacted_from;
    if (cf) headKids.push(h("span", {class: "compacted-from"}, ` · goes on from the summary in segment ${cf.segment}` +
                                                               (cf.call_id ? ` (${cf.call_id})` : "")));
    box.appendChild(h("div", {class: "segment-head"}, headKids));
    const body = h("div", {class: "tokens"});
    box.appendChild(body);
    root.appendChild(box);
    let offset = 0;
    while (offset < seg.n_tokens) {
      const page = await api(`/api/runs/${r}/episodes/${encodeURIComponent(sid)}/tokens?segment=${seg.index}` +
                             `&offset=${offset}&limit=4000`);
      body.appendChild(tokenSpans(page));
      offset += page.ids.length;
      if (!page.ids.length) break;
      if (offset >= TOKEN_AUTOLOAD && offset < seg.n_tokens) {
        const btn = h("button", {class: "more-tokens"}, `load more (${offset} of ${seg.n_tokens})`);
        box.appendChild(btn);
        await new Promise(res => btn.addEventListener("click", () => { btn.remove(); res(); }, {once: true}));
      }
    }
  }
  root.dataset.loaded = "true";
}

// Logprob heat on a log scale: green at logprob 0 (p = 1), yellow at -6, red at HEAT_FLOOR and below.
const HEAT_FLOOR = -12;
function heat(lp) {
  const x = Math.min(1, Math.max(0, 1 - lp / HEAT_FLOOR));
  return `hsl(${(120 * x).toFixed(1)}, 70%, 82%)`;
}

function tokenSpans(page) {
  const frag = document.createDocumentFragment();
  const starts = {};
  for (const [call, pos] of Object.entries(page.call_starts)) starts[pos] = call;
  for (let k = 0; k < page.ids.length; k++) {
    const pos = page.offset + k;
    if (starts[pos] !== undefined) frag.appendChild(h("span", {class: "call-mark"}, `call ${starts[pos]} ▸`));
    const sampled = page.mask[k] === 1;
    const text = page.text ? page.text[k] : `[${page.ids[k]}]`;
    const span = document.createElement("span");
    span.className = sampled ? "tok sampled" : "tok";
    span.textContent = text.includes("\n") ? text.replace(/\n/g, "↵\n") : text;
    span.title = `#${pos} id ${page.ids[k]} · ` + (sampled
      ? `sampled · logprob ${page.logprob[k].toFixed(3)} (p ${Math.exp(page.logprob[k]).toFixed(3)}) · version ${page.version[k]}`
      : "prompt (loss mask 0)") + ` · call ${page.call[k]}`;
    if (sampled) {
      span.style.setProperty("--heat", heat(page.logprob[k]));
      span.style.setProperty("--ver", `hsl(${(page.version[k] * 67) % 360}, 60%, 80%)`);
      span.dataset.version = page.version[k];
    }
    frag.appendChild(span);
  }
  return frag;
}

// ---- compare ---------------------------------------------------------------------------
async function comparePage() {
  const sums = await Promise.all(RUNS.map(r => api(`/api/runs/${r.run}/summary`)));
  const rewards = lineChart(sums.map((s, i) => ({name: `${i}: ${s.name}`, color: COLORS[i % COLORS.length],
                                                 points: s.curve.points.map(p => [p.x, p.reward])})),
                            {title: "reward curves", xLabel: sums.every(s => s.curve.x === "step") ? "step" : "step / episode",
                             yMin: 0});
  const head = h("tr", {}, h("th", {}, "task"), RUNS.map((r, i) => h("th", {}, `${i}: ${r.name}`)));
  const body = h("tbody");
  const pager = h("div", {class: "pager"});
  $main.replaceChildren(h("h1", {}, "compare runs"),
    h("div", {class: "cards"}, sums.map((s, i) => card(`${i}: ${s.name} success`, fmt(s.success_rate)))),
    h("div", {class: "charts"}, rewards),
    h("h2", {}, "episode outcomes per task (successes / episodes, mean reward)"),
    h("table", {id: "compare-tasks", class: "grid"}, h("thead", {}, head), body), pager);
  let offset = 0;
  async function load() {
    const page = await api(`/api/compare/tasks?runs=${RUNS.map(r => r.run).join(",")}&offset=${offset}&limit=100`);
    body.replaceChildren(...page.rows.map(row => h("tr", {"data-task": row.task_id}, h("td", {}, row.task_id),
      page.runs.map(r => {
        const o = row.by_run[String(r)];
        if (!o) return h("td", {class: "muted"}, "-");
        const cls = o.successes === o.episodes ? "all-pass" : (o.successes ? "some-pass" : "none-pass");
        return h("td", {class: cls}, `${o.successes}/${o.episodes} · ${fmt(o.reward_mean)}`);
      }))));
    const end = offset + page.rows.length;
    pager.replaceChildren(
      h("button", {disabled: offset === 0 ? "disabled" : null, onclick: () => { offset = Math.max(0, offset - 100); load(); }}, "‹ prev"),
      h("span", {class: "page-info"}, `${page.total ? offset + 1 : 0}–${end} of ${page.total} tasks`),
      h("button", {disabled: end >= page.total ? "disabled" : null, onclick: () => { offset += 100; load(); }}, "next ›"));
  }
  await load();
}

// ---- router ----------------------------------------------------------------------------
async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "run" && parts[2] === "episode") await episodePage(+parts[1], parts[3]);
    else if (parts[0] === "run") await runPage(+parts[1]);
    else if (parts[0] === "compare") await comparePage();
    else if (RUNS.length > 1) await comparePage();
    else await runPage(0);
    document.body.dataset.ready = location.hash || "#/";
  } catch (e) {
    showError(e);
    document.body.dataset.ready = "error";
  }
}

window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; route(); });
(async () => {
  try { RUNS = await api("/api/runs"); } catch (e) { showError(e); return; }
  renderNav();
  route();
})();
