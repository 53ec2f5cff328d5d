// dispatchd web console: plain JS, no build step. Reads the JSON API under /api/v1/ with the
// bearer token kept in sessionStorage, and refreshes the open view every second.
'use strict';

const TOKEN_KEY = 'dispatchd.token';
const REFRESH_MS = 1000;
const ACTIVE = ['JOB_STATE_QUEUED', 'JOB_STATE_DISPATCHED', 'JOB_STATE_RUNNING'];
const STATES = ['queued', 'dispatched', 'running', 'succeeded', 'failed', 'cancelled', 'expired'];

let route = null;       // what the open view shows, from the location's hash
let refreshing = false; // a refresh is in flight

// ---- helpers -------------------------------------------------------------------------------

function $(sel, root) { return (root || document).querySelector(sel); }

// An element with attributes and children (strings become text, never markup).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    el.append(c);  // an element as it is, anything else as its text
  }
  return el;
}

function stateName(s) { return String(s || '').replace(/^JOB_STATE_/, ''); }

function stateCell(s) {
  const name = stateName(s);
  return h('td', { class: `state state-${name}` }, name);
}

// A time as UTC, to the second, or to the millisecond when `precise` (a job's timeline, where
// one attempt can start and end within a second).
function time(ts, precise) {
  if (!ts) return '';
  const d = new Date(ts);
  if (isNaN(d)) return ts;
  const iso = d.toISOString().replace('T', ' ');
  return precise ? iso : iso.replace(/\.\d+Z$/, 'Z');
}

function num(v, digits) {
  const n = Number(v || 0);
  return digits === undefined ? String(n) : n.toFixed(digits);
}

function table(headers, rows, empty) {
  if (rows.length === 0) return h('p', { class: 'muted' }, empty || 'none');
  return h('table', {}, h('thead', {}, h('tr', {}, headers.map((x) => h('th', {}, x)))),
           h('tbody', {}, rows));
}

function showError(message) {
  const box = $('#error');
  box.textContent = message || '';
  box.hidden = !message;
}

// ---- the API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code;
    this.field = e.field;
  }
}

async function api(path, method) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(`/api/v1/${path}`, { method: method || 'GET', headers, cache: 'no-store' });
  let body = null;
  try { body = await res.json(); } catch (_) { body = null; }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

// ---- views -----------------------------------------------------------------------------------

function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const parts = path.split('/');
  const params = new URLSearchParams(query || '');
  if (parts[0] === 'job' && parts[1]) return { view: 'job', id: decodeURIComponent(parts[1]) };
  if (parts[0] === 'workers') return { view: 'workers' };
  if (parts[0] === 'jobs') return { view: 'jobs', params };
  return { view: 'queues' };
}

async function renderQueues(view, first, shown) {
  const s = await api('queues');
  if (shown !== route) return;  // the user moved on while it loaded
  const reason = (r) => h('td', { class: 'reason' }, r || '');
  view.replaceChildren(
    h('p', {}, `${s.workers} workers, ${s.slots_busy} of ${s.slots_total} slots busy; `,
      s.leader && s.leader.is_leader ? 'this daemon leads' : `leader: ${(s.leader || {}).address || 'unknown'}`),
    h('h2', {}, 'Tiers'),
    table(['tier', 'priority', 'cap', 'queued', 'running', 'why the first job waits'],
          (s.tiers || []).map((t) => h('tr', { 'data-tier': t.tier }, h('td', {}, t.tier),
            h('td', { class: 'num' }, t.priority), h('td', { class: 'num' }, t.cap || 'none'),
            h('td', { class: 'num' }, num(t.queued)), h('td', { class: 'num' }, num(t.running)),
            reason(t.head_wait_reason)))),
    h('h2', {}, 'Types'),
    table(['type', 'queued', 'dispatched', 'running', 'succeeded', 'failed', 'cancelled', 'expired',
           'why the first job waits'],
          (s.types || []).map((t) => h('tr', { 'data-type': t.type }, h('td', {}, t.type),
            ['queued', 'dispatched', 'running', 'succeeded', 'failed', 'cancelled', 'expired']
              .map((k) => h('td', { class: `num ${k}` }, num(t[k]))),
            reason(t.head_wait_reason)))),
    h('h2', {}, 'Models'),
    table(['model', 'queued', 'running', 'resident on', 'rate tokens', 'why the first job waits'],
          (s.models || []).map((m) => h('tr', { 'data-model': m.model }, h('td', {}, m.model),
            h('td', { class: 'num' }, num(m.queued)), h('td', { class: 'num' }, num(m.running)),
            h('td', { class: 'num' }, num(m.resident_on)),
            h('td', { class: 'num' }, Number(m.tokens) < 0 ? 'unlimited' : num(m.tokens, 2)),
            reason(m.head_wait_reason)))),
    h('h2', {}, 'Tenants'),
    table(['tenant', 'weight', 'queued', 'running', 'share', 'fair share', 'keys'],
          (s.tenants || []).map((t) => h('tr', {}, h('td', {}, t.tenant),
            h('td', { class: 'num' }, num(t.weight, 2)), h('td', { class: 'num' }, num(t.queued)),
            h('td', { class: 'num' }, num(t.running)), h('td', { class: 'num' }, num(t.share, 2)),
            h('td', { class: 'num' }, num(t.fair_share, 2)), h('td', { class: 'num' }, num(t.keys))))),
    h('h2', {}, `Fairness keys (${num(s.keys_total)})`),
    table(['key', 'tenant', 'queued', 'running', 'cost', 'why the first job waits'],
          (s.keys || []).map((k) => h('tr', {}, h('td', {}, k.fairness_key), h('td', {}, k.tenant),
            h('td', { class: 'num' }, num(k.queued)), h('td', { class: 'num' }, num(k.running)),
            h('td', { class: 'num' }, num(k.cost, 2)), reason(k.head_wait_reason)))));
}

async function drain(id) {
  if (!confirm(`Drain worker ${id}? It finishes its jobs and takes no new ones.`)) return;
  try {
    await api(`workers/${encodeURIComponent(id)}/drain`, 'POST');
    refresh();
  } catch (e) { showError(`drain ${id}: ${e.message}`); }
}

async function renderWorkers(view, first, shown) {
  const w = (await api('workers')).workers || [];
  if (shown !== route) return;
  const gb = (v) => (Number(v) < 0 ? 'no GPU' : `${num(v, 1)} GB`);
  view.replaceChildren(
    h('h2', {}, `Workers (${w.length})`),
    table(['worker', 'peer', 'types', 'slots busy', 'VRAM in use', 'resident models', 'model loads',
           'status', 'last seen', ''],
          w.map((x) => h('tr', { 'data-worker-id': x.worker_id }, h('td', {}, x.worker_id),
            h('td', {}, x.peer), h('td', {}, (x.types || []).join(', ')),
            h('td', { class: 'num' }, `${x.busy} / ${x.slots}`),
            h('td', { class: 'num' }, Number(x.vram_gb) < 0 ? 'no GPU' : `${gb(x.vram_in_use_gb)} of ${gb(x.vram_gb)}`),
            h('td', {}, (x.models_resident || []).join(', ')),
            h('td', { class: 'num' }, num(x.model_loads)),
            h('td', { class: 'status' }, x.draining ? 'draining' : x.memory_throttled ? 'memory throttled' : 'serving'),
            h('td', {}, time(x.last_seen)),
            h('td', {}, x.draining ? '' : h('button', { class: 'danger drain', onclick: () => drain(x.worker_id) }, 'Drain')))),
          'no worker is connected'));
}

async function cancelJob(id) {
  if (!confirm(`Cancel job ${id}?`)) return;
  try {
    await api(`jobs/${encodeURIComponent(id)}/cancel`, 'POST');
    refresh();
  } catch (e) { showError(`cancel ${id}: ${e.message}`); }
}

function toIso(local) { return local ? new Date(local).toISOString() : ''; }

function searchForm(params) {
  const input = (name, label, attrs) =>
    h('label', {}, `${label} `, h('input', Object.assign({ name, value: params.get(name) || '' }, attrs || {})));
  const state = h('select', { name: 'state' }, h('option', { value: '' }, 'any state'),
                  STATES.map((s) => h('option', { value: s, selected: params.get('state') === s }, s)));
  const form = h('form', { class: 'search', id: 'job-search' },
    h('label', {}, 'id ', h('input', { name: 'id', placeholder: 'open a job by id' })),
    h('label', {}, 'state ', state), input('type', 'type'), input('key', 'key'),
    input('since', 'created since', { type: 'datetime-local', step: 1 }),
    input('until', 'until', { type: 'datetime-local', step: 1 }),
    h('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    if (data.get('id')) { location.hash = `#/job/${encodeURIComponent(data.get('id').trim())}`; return; }
    const q = new URLSearchParams();
    for (const k of ['state', 'type', 'key', 'since', 'until']) if (data.get(k)) q.set(k, data.get(k));
    location.hash = `#/jobs?${q}`;
  });
  return form;
}

async function renderJobs(view, first, shown) {
  const params = shown.params;
  if (first) view.replaceChildren(searchForm(params), h('div', { id: 'job-results' }));
  const q = new URLSearchParams();
  for (const k of ['state', 'type', 'key']) if (params.get(k)) q.set(k, params.get(k));
  for (const k of ['since', 'until']) if (params.get(k)) q.set(k, toIso(params.get(k)));
  const jobs = (await api(`jobs?${q}`)).jobs || [];
  if (shown !== route) return;
  $('#job-results').replaceChildren(table(
    ['id', 'type', 'key', 'owner', 'state', 'attempt', 'worker', 'created', 'finished', 'error', ''],
    jobs.map((j) => h('tr', { 'data-job-id': j.id },
      h('td', {}, h('a', { href: `#/job/${encodeURIComponent(j.id)}` }, j.id)),
      h('td', {}, j.spec.type), h('td', {}, j.fairness_key), h('td', {}, j.owner),
      stateCell(j.state), h('td', { class: 'num' }, `${j.attempt} / ${j.max_attempts}`),
      h('td', {}, j.worker_id), h('td', {}, time(j.created_at)), h('td', {}, time(j.finished_at)),
      h('td', {}, j.error),
      h('td', {}, ACTIVE.includes(j.state)
        ? h('button', { class: 'danger cancel', 'data-job-id': j.id, onclick: () => cancelJob(j.id) }, 'Cancel')
        : ''))),
    'no job matches'));
}

async function renderJob(view, first, shown) {
  let page;
  try {
    page = await api(`jobs/${encodeURIComponent(shown.id)}`);
  } catch (e) {
    if (e.status === 404 && shown === route) {
      view.replaceChildren(h('p', {}, `No job ${shown.id} (or not yours).`));
      return;
    }
    throw e;
  }
  if (shown !== route) return;
  const j = page.job;
  const field = (k, v, attrs) => [h('dt', {}, k), h('dd', attrs || {}, v)];
  view.replaceChildren(
    h('h2', {}, `Job ${j.id}`),
    h('dl', {},
      field('state', stateName(j.state), { id: 'job-state', class: `state state-${stateName(j.state)}` }),
      field('type', j.spec.type), field('owner', j.owner || '(none)'), field('fairness key', j.fairness_key),
      field('resource', j.spec.resource_id), field('attempts', `${j.attempt} of ${j.max_attempts}`),
      field('worker', j.worker_id),
      j.wait_reason ? field('why it waits', `${j.wait_reason}, position ${j.queue_position}`, { class: 'reason' }) : [],
      field('error', j.error || '', { id: 'job-error' }),
      field('payload', `${page.payload_bytes} bytes`),
      field('result', `${page.result_bytes} bytes`, { id: 'job-result-bytes' })),
    ACTIVE.includes(j.state)
      ? h('button', { class: 'danger cancel', id: 'cancel', onclick: () => cancelJob(j.id) }, 'Cancel job')
      : '',
    h('h2', {}, 'Timeline'),
    table(['event', 'at', 'detail'], page.timeline.map((e) => h('tr', { 'data-event': e.event },
      h('td', {}, e.event), h('td', {}, time(e.at, true)), h('td', {}, e.detail)))));
}

const VIEWS = { queues: renderQueues, workers: renderWorkers, jobs: renderJobs, job: renderJob };

async function refresh(first) {
  if (refreshing && !first) return;
  refreshing = true;
  const shown = route;
  try {
    await VIEWS[shown.view]($('#view'), first, shown);
    if (shown === route) { showError(''); $('#live').classList.remove('stale'); }
  } catch (e) {
    if (shown !== route) return;
    $('#live').classList.add('stale');
    if (e.status === 401) showError(`${e.message}: enter a bearer token above.`);
    else if (e.status === 403) showError(`${e.message} (this view needs the admin role).`);
    else showError(e.message);
  } finally {
    refreshing = false;
  }
}

function navigate() {
  route = parseRoute();
  for (const v of ['queues', 'workers', 'jobs']) {
    $(`#nav-${v}`).classList.toggle('active', route.view === v || (v === 'jobs' && route.view === 'job'));
  }
  $('#view').replaceChildren();
  refresh(true);
}

document.addEventListener('DOMContentLoaded', () => {
  $('#token').value = sessionStorage.getItem(TOKEN_KEY) || '';
  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('#token').value.trim());
    refresh(true);
  });
  $('#token-forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $('#token').value = '';
    refresh(true);
  });
  window.addEventListener('hashchange', navigate);
  navigate();
  setInterval(() => refresh(false), REFRESH_MS);
});
