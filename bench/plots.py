#!/usr/bin/env python3
"""Draws a sitting of bench.py as OUT.png, from its OUT.csv and OUT.json.

bench.py draws it after each scenario (unless --no-plot). To redraw from files already written:

  python3 bench/plots.py OUT.json [OUT.json ...]     # writes OUT.png beside each
  python3 bench/plots.py OUT.csv --scenario drain    # a CSV alone: no machine, peer or targets

Each run's figures come from OUT.csv (one row per run); OUT.json adds what the CSV does not hold:
the machine and the date for the title, the drain's and the latency's graphile-worker runs, the
targets, the arguments. Each scenario in FIGURES has a figure of its own; any other scenario, or a
CSV that lacks the columns its figure needs, gets a bar chart of its numeric columns, one panel
per unit.

Needs matplotlib: Debian's python3-matplotlib is for /usr/bin/python3 (deploy/install-deps.sh
installs it). Without it, draw() says how to get it and draws nothing. The rest is the standard
library.
"""

import argparse
import csv
import datetime
import json
import os
import re
import statistics
import sys

HINT = ("apt-get install python3-matplotlib and run with /usr/bin/python3, or pip install "
        "matplotlib for this interpreter")

# Columns that say how a run was set up rather than what it measured: left out of the generic
# chart.
SETUP_COLUMNS = {"run", "seed", "jobs", "tasks", "slots", "workers", "retained", "probes"}


class PlotError(Exception):
    """The files cannot make the figure (missing, unreadable, or without the columns)."""


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def missing_matplotlib():
    return f"matplotlib is not installed for {sys.executable}: no plot ({HINT})"


# ------------------------------------------------------------------------------------------------
# A sitting: the runs' rows and the JSON beside them.


def number(text):
    """A CSV cell as int or float where it is one, None where empty, else the text."""
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Sitting:
    """One bench.py sitting read back: rows (one dict per run, numbers parsed), doc (OUT.json,
    or {} without it), scenario, and the OUT prefix that the PNG and any series file share."""

    def __init__(self, out, scenario=None):
        base = out[:-5] if out.endswith(".json") else out[:-4] if out.endswith(".csv") else out
        self.base = base
        self.doc = {}
        if os.path.exists(base + ".json"):
            try:
                with open(base + ".json") as f:
                    self.doc = json.load(f)
            except (OSError, ValueError) as e:
                raise PlotError(f"{base}.json: {e}")
        if os.path.exists(base + ".csv"):
            try:
                with open(base + ".csv", newline="") as f:
                    self.rows = [{k: number(v) for k, v in row.items()}
                                 for row in csv.DictReader(f)]
            except (OSError, csv.Error) as e:
                raise PlotError(f"{base}.csv: {e}")
        elif self.doc.get("runs"):
            self.rows = [{"run": i, **r} for i, r in enumerate(self.doc["runs"], 1)]
        else:
            raise PlotError(f"neither {base}.csv nor {base}.json with runs")
        if not self.rows:
            raise PlotError(f"{base}.csv holds no run")
        self.scenario = scenario or self.doc.get("scenario")
        if not self.scenario:
            raise PlotError(f"{base}: no scenario (no OUT.json beside it: pass --scenario)")
        self.runs = [r.get("run") or i for i, r in enumerate(self.rows, 1)]

    def has(self, key):
        return any(is_number(r.get(key)) for r in self.rows)

    def col(self, key):
        """The column's value in each run, None where it has no number."""
        return [r.get(key) if is_number(r.get(key)) else None for r in self.rows]

    def need(self, key):
        if not self.has(key):
            raise PlotError(f"{self.scenario}: no {key} column")
        return self.col(key)

    def median(self, key):
        vals = [v for v in self.col(key) if v is not None]
        return statistics.median(vals) if vals else None

    def arg(self, name, default=None):
        return (self.doc.get("args") or {}).get(name, default)

    def target(self, key):
        """The target of a figure (OUT.json's targets), or None."""
        t = (self.doc.get("targets") or {}).get(key)
        return t.get("target") if isinstance(t, dict) else None

    def title(self):
        m = self.doc.get("machine") or {}
        machine = ", ".join(str(x) for x in (
            m.get("cpu"), f"{m['nproc']} cores" if m.get("nproc") else None, m.get("memory"))
            if x) or "machine not recorded"
        started = self.doc.get("started")
        if started:
            date = started[:10]
        else:
            path = self.base + ".csv"
            date = datetime.date.fromtimestamp(os.path.getmtime(path)).isoformat() + \
                " (the CSV's date)" if os.path.exists(path) else "date not recorded"
        n = len(self.rows)
        return f"{self.scenario}: {machine}; {date}; {n} run{'s' if n != 1 else ''}"


# ------------------------------------------------------------------------------------------------
# Drawing helpers.


def fmt(v):
    if v is None:
        return ""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def ratio_label(label, ratio, what):
    return f"{label} ({ratio:.2f}x {what})" if ratio is not None else label


def bars(ax, groups, series, ylabel, labels=True, columns=2):
    """Grouped bars: one group per entry of `groups` (the x tick labels), one bar per series
    (label, values, one per group; None draws nothing)."""
    series = [(label, vals) for label, vals in series if any(v is not None for v in vals)]
    width = 0.8 / max(len(series), 1)
    for k, (label, vals) in enumerate(series):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [float("nan") if v is None else v for v in vals]
        drawn = ax.bar(xs, heights, width, label=label)
        if labels and len(series) * len(groups) <= 24:
            ax.bar_label(drawn, labels=[fmt(v) for v in vals], fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels
    ax.grid(axis="y", alpha=0.3)
    legend_below(ax, columns)


def legend_below(ax, columns=2):
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=columns, fontsize=7,
              frameon=False)


def target_line(ax, value, label):
    if value is not None:
        ax.axhline(value, color="k", linestyle="--", linewidth=0.9, label=label)


def run_ticks(s):
    return [f"run {r}" for r in s.runs]


def figure(plt, s, panels, width=6.0, height=3.8):
    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
    return fig, list(axes[0])


def finish(fig, s):
    fig.suptitle(s.title(), fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# One figure per scenario. Each takes (plt, sitting) and returns the figure, or raises PlotError
# when the CSV lacks a column it needs (then the generic chart is drawn instead).


def drain_figure(plt, s):
    """jobs/s per run: dispatchd, graphile-worker's runs (the peer, same server and sitting) and
    PostgreSQL's ceiling for the same jobs."""
    own = s.need("jobs_per_s")
    n = len(own)
    series = [(f"dispatchd (median {fmt(s.median('jobs_per_s'))})", own)]
    peer = s.doc.get("peer") or {}
    if peer.get("runs"):
        runs = (list(peer["runs"]) + [None] * n)[:n]
        ratio = s.median("jobs_per_s") / peer["median"] if peer.get("median") else None
        text = f"graphile-worker, its own runs after dispatchd's (median {fmt(peer['median'])})"
        if ratio is not None:
            text += f": dispatchd's median is {ratio:.2f}x it"
        series.append((text, runs))
    if s.has("ceiling_jobs_per_s"):
        script = next((r.get("ceiling_script") for r in s.rows if r.get("ceiling_script")),
                      "claim_complete.sql")
        text = f"PostgreSQL alone after each run ({os.path.basename(str(script))})"
        fraction = s.median("fraction_of_ceiling")
        if fraction is not None:
            text += f": dispatchd at {fraction:.2f}x it (median)"
        series.append((text, s.col("ceiling_jobs_per_s")))
    fig, (ax,) = figure(plt, s, 1, width=7.5)
    bars(ax, run_ticks(s), series, "jobs/s, first dispatch to last finish", columns=1)
    jobs = s.median("jobs")
    ax.set_title(f"drain of {fmt(jobs)} queued no-op jobs" if jobs else "drain", fontsize=9)
    return finish(fig, s)


LATENCY_KINDS = (("submit_to_worker", "Submit to worker"), ("submit_ack", "Submit answer"),
                 ("runsync", "RunSync round trip"),
                 # PostgreSQL's floor beside each run (bench/ceiling/insert_one.sql at --rate).
                 ("pg_floor_insert", "PostgreSQL alone:\none insert's commit"))
LATENCY_SPLIT = (("send_to_insert_p50_ms", "send to insert"),
                 ("insert_to_claim_p50_ms", "insert to claim"),
                 ("claim_to_handler_p50_ms", "claim to handler"))


# bench.py latency's peer (OUT.json's peer): graphile-worker's probes, after dispatchd's runs.
PEER_LATENCY_KINDS = (("add_to_start", "graphile-worker:\nadd_job to task start"),
                      ("add_answered", "graphile-worker:\nadd_job answer"))


def peer_latency(s):
    """The latency peer's runs in OUT.json: ([(kind, name)] that it has, [run dicts], {medians}),
    or ([], [], {}) without one."""
    peer = s.doc.get("peer") or {}
    runs = [r for r in peer.get("runs") or [] if isinstance(r, dict)]
    med = peer.get("median") if isinstance(peer.get("median"), dict) else {}
    kinds = [(k, name) for k, name in PEER_LATENCY_KINDS
             if any(is_number(r.get(f"{k}_p50_ms")) for r in runs)]
    return kinds, runs, med


def peer_targets(s, peer_med):
    """The targets set against the peer (OUT.json's targets KIND_PCT_to_peer_PEERPCT, a limit on
    the ratio): {(kind, pct): the latency in ms it allows, limit x the peer's median}."""
    out = {}
    for key, t in (s.doc.get("targets") or {}).items():
        m = re.fullmatch(r"(.+)_(p\d+)_to_peer_(p\d+)", key)
        theirs = peer_med.get(f"add_to_start_{m.group(3)}_ms") if m else None
        if m and isinstance(t, dict) and is_number(t.get("target")) and is_number(theirs):
            out[(m.group(1), m.group(2))] = t["target"] * theirs
    return out


def latency_figure(plt, s):
    """p50 and p99 of each probe kind (median of the runs, each run a dot, targets dashed), and
    beside them graphile-worker's where OUT.json has its runs (hatched; the targets set as a
    ratio to it dotted, at the latency they allow); and Submit to worker's p50 split where the
    rows' created_at and dispatched_at fall."""
    kinds = [(k, name) for k, name in LATENCY_KINDS if s.has(f"{k}_p50_ms")]
    if not kinds:
        raise PlotError("latency: no *_p50_ms column")
    peer_kinds, peer_runs, peer_med = peer_latency(s)
    allowed = peer_targets(s, peer_med)
    split = [(k, name) for k, name in LATENCY_SPLIT if s.has(k)]
    fig, axes = figure(plt, s, 2 if split else 1, width=6.0 + 1.5 * len(peer_kinds))
    ax = axes[0]
    pcts = ("p50", "p99")
    width = 0.38
    groups = [(k, name, False) for k, name in kinds] + [(k, n, True) for k, n in peer_kinds]
    for j, pct in enumerate(pcts):
        xs = [g + (j - 0.5) * width for g in range(len(groups))]
        med = [peer_med.get(f"{k}_{pct}_ms") if peer else s.median(f"{k}_{pct}_ms")
               for k, _, peer in groups]
        drawn = ax.bar(xs, [v if is_number(v) else float("nan") for v in med], width,
                       label=f"{pct} (median of the runs)", color=f"C{j}",
                       hatch=["//" if peer else "" for _, _, peer in groups])
        ax.bar_label(drawn, labels=[fmt(v) if is_number(v) else "" for v in med], fontsize=7,
                     padding=1)
        for x, (k, _, peer) in zip(xs, groups):
            vals = [r.get(f"{k}_{pct}_ms") for r in peer_runs] if peer else \
                s.col(f"{k}_{pct}_ms")
            vals = [v for v in vals if is_number(v)]
            ax.plot([x] * len(vals), vals, "k.", markersize=4)
            if peer:
                continue
            t = s.target(f"{k}_{pct}_ms")
            if t is not None:
                ax.hlines(t, x - width / 2, x + width / 2, colors="r", linestyles="--")
            if (k, pct) in allowed:
                ax.hlines(allowed[(k, pct)], x - width / 2, x + width / 2, colors="m",
                          linestyles=":", linewidth=2, zorder=3)
    ax.plot([], [], "k.", label="each run")
    ax.plot([], [], "r--", label="target")
    if allowed:
        ax.plot([], [], "m:", linewidth=2, label="target as a ratio to graphile-worker")
    if peer_kinds:
        ax.axvline(len(kinds) - 0.5, color="0.6", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([name for _, name, _ in groups], fontsize=8 if peer_kinds else None)
    ax.set_ylabel("ms")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    probes = s.median("probes")
    title = f"light load: {fmt(probes)} probes of each kind per run" if probes else "light load"
    if peer_kinds:
        title += "; graphile-worker's after dispatchd's runs, same server"
    ax.set_title(title, fontsize=9)
    if split:
        ax = axes[1]
        bottom = [0.0] * len(s.rows)
        for k, name in split:
            vals = [v or 0.0 for v in s.col(k)]
            ax.bar(run_ticks(s), vals, 0.6, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if s.has("submit_to_worker_p50_ms"):
            ax.plot(run_ticks(s), s.col("submit_to_worker_p50_ms"), "kD", markersize=5,
                    label="Submit to worker p50")
        ax.set_ylabel("ms (p50 of each part)")
        ax.set_title("Submit to worker p50, split at created_at and dispatched_at", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return finish(fig, s)


PROFILE_VARIANTS = ("drain", "submit", "batch", "runsync")


def profile_components(s, variant):
    """(name, column less the variant's prefix) of each CPU component the CSV holds for
    `variant`, in the CSV's order: the daemon's thread groups, the workers, the load generator,
    PostgreSQL's process kinds, and the rest of the machine. Their sum is the machine's."""
    out = []
    for key in s.rows[0]:
        m = re.fullmatch(rf"{variant}_((daemon_.+|postgres_.+|workers_cpu|loadgen_cpu|other_cpu)"
                         r"_us_per_job)", key)
        if m and m.group(2) not in ("daemon_cpu", "postgres_cpu"):  # the totals
            out.append((m.group(2).replace("_cpu", "").replace("_", " "), m.group(1)))
    return out


def profile_figure(plt, s):
    """CPU µs per job by component, stacked, one bar per variant (medians of the runs); the
    whole machine's as a marker, each variant's jobs/s above it."""
    variants = [v for v in PROFILE_VARIANTS if s.has(f"{v}_machine_cpu_us_per_job")]
    if not variants:
        raise PlotError("profile: no *_machine_cpu_us_per_job column")
    components = {}  # name -> column less the variant's prefix
    for v in variants:
        for name, suffix in profile_components(s, v):
            components.setdefault(name, suffix)
    fig, (ax,) = figure(plt, s, 1, width=8.5, height=4.6)
    cmap = plt.get_cmap("tab20")
    bottom = [0.0] * len(variants)
    for k, (name, suffix) in enumerate(components.items()):
        # A share below zero (`other`, when the named processes' ticks outrun the machine's)
        # stacks as nothing.
        vals = [max(s.median(f"{v}_{suffix}") or 0.0, 0.0) for v in variants]
        ax.bar(variants, vals, 0.6, bottom=bottom, label=name, color=cmap(k % 20))
        bottom = [b + x for b, x in zip(bottom, vals)]
    machine = [s.median(f"{v}_machine_cpu_us_per_job") for v in variants]
    ax.plot(variants, machine, "kD", markersize=5, label="whole machine")
    for x, (v, top) in enumerate(zip(variants, bottom)):
        rate = s.median(f"{v}_jobs_per_s")
        if rate is not None:
            ax.annotate(f"{fmt(rate)} jobs/s", (x, max(top, machine[x] or 0)), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 3), textcoords="offset points")
    ax.set_ylabel("CPU µs per job (median of the runs)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.set_title("where a job's CPU goes, by the way jobs arrive", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return finish(fig, s)


def fleet_figure(plt, s):
    """jobs/s per run of the 4-worker drain and the fleet's steady, flap and join drains, with
    the fleet's capacity; and the ratios, each with its target."""
    steady = s.need("steady_jobs_per_s")
    join = s.arg("join")
    series = [("4 workers' drain", s.col("drain_jobs_per_s")),
              (ratio_label("fleet, steady", s.median("fleet_to_drain"), "the 4 workers"),
               steady),
              (ratio_label("fleet, one worker flapping", s.median("flap_to_steady"), "steady"),
               s.col("flap_jobs_per_s")),
              (ratio_label(f"fleet, {join} workers joining" if join else "fleet, workers joining",
                           s.median("join_to_steady"), "steady"), s.col("join_jobs_per_s"))]
    fig, axes = figure(plt, s, 2)
    bars(axes[0], run_ticks(s), series, "jobs/s, first dispatch to last finish")
    capacity = s.median("capacity_jobs_per_s")
    if capacity is not None:
        target_line(axes[0], capacity, f"the fleet's capacity ({fmt(capacity)})")
        legend_below(axes[0])
    workers = s.median("workers") or s.arg("fleet_workers")
    axes[0].set_title(f"{fmt(workers)} simulated workers" if workers else "fleet", fontsize=9)
    ratios = [(k, name) for k, name in (("fleet_to_drain", "steady / 4 workers"),
                                        ("flap_to_steady", "flap / steady"),
                                        ("join_to_steady", "join / steady")) if s.has(k)]
    ax = axes[1]
    bars(ax, [name for _, name in ratios], [(f"run {r}", [s.col(k)[i] for k, _ in ratios])
                                            for i, r in enumerate(s.runs)], "ratio")
    for g, (k, _) in enumerate(ratios):
        t = s.target(k)
        if t is not None:
            ax.hlines(t, g - 0.45, g + 0.45, colors="r", linestyles="--")
    ax.plot([], [], "r--", label="target")
    legend_below(ax, 4)
    ax.set_title("the ratios, per run", fontsize=9)
    return finish(fig, s)


def versus_drain_figure(plt, s, series, title):
    """jobs/s per run of each (column, label, ratio column, what the ratio is to) in `series`
    that the CSV holds; the first column is required."""
    s.need(series[0][0])
    fig, (ax,) = figure(plt, s, 1, width=7.5)
    bars(ax, run_ticks(s), [(ratio_label(label, s.median(r) if r else None, what), s.col(k))
                            for k, label, r, what in series],
         "jobs/s")
    ax.set_title(title, fontsize=9)
    return finish(fig, s)


def e2e_figure(plt, s):
    jobs = fmt(s.median("jobs"))
    return versus_drain_figure(plt, s, [
        ("single_submitted_per_s", "Submit: submitted", None, None),
        ("single_completed_per_s", "Submit: completed", "single_completed_to_drain", "drain"),
        ("batch_submitted_per_s", "SubmitBatch: submitted", None, None),
        ("batch_completed_per_s", "SubmitBatch: completed", "batch_completed_to_drain", "drain"),
        ("drain_jobs_per_s", "preloaded drain", None, None),
        ("ceiling_jobs_per_s", "PostgreSQL alone (insert_claim_complete.sql)", None, None)],
        f"{jobs} jobs submitted while the workers drain, from the first send")


def backlog_figure(plt, s):
    return versus_drain_figure(plt, s, [
        ("jobs_per_s", f"drain with {fmt(s.median('jobs'))} queued at start", "ratio_to_drain",
         "the plain drain"),
        ("drain_jobs_per_s", f"plain drain of {fmt(s.arg('jobs'))}" if s.arg("jobs")
         else "plain drain", None, None)],
        "a big backlog against a plain drain, in the same runs")


def retained_figure(plt, s):
    kept = s.median("retained") or s.arg("retained")
    return versus_drain_figure(plt, s, [
        ("jobs_per_s", f"drain next to {fmt(kept)} ended jobs kept" if kept else
         "drain next to ended jobs kept", "ratio_to_drain", "the plain drain"),
        ("drain_jobs_per_s", "plain drain", None, None)],
        "ended jobs kept in the database against a plain drain, in the same runs")


def submitted_figure(plt, s):
    return versus_drain_figure(plt, s, [
        ("submitted_jobs_per_s", "jobs queued by SubmitBatch, then drained",
         "submitted_to_drain", "the preloaded drain"),
        ("drain_jobs_per_s", "preloaded drain", None, None)],
        "a drain of submitted jobs against a preloaded one, in the same runs")


def turncost_figure(plt, s):
    """The turn statements' µs per job and the drain's jobs/s against the jobs queued, a line
    per run."""
    sizes = sorted(int(m.group(1)) for m in (re.fullmatch(r"q(\d+)_turn_us_per_job", k)
                                             for k in s.rows[0]) if m)
    if not sizes:
        raise PlotError("turncost: no q*_turn_us_per_job column")
    fig, axes = figure(plt, s, 2)
    growth = s.median("largest_to_smallest")
    for ax, key, ylabel in ((axes[0], "turn_us_per_job", "turn statements' µs per job"),
                            (axes[1], "jobs_per_s", "jobs/s, first dispatch to last finish")):
        for i, r in enumerate(s.runs):
            ax.plot(sizes, [s.col(f"q{n}_{key}")[i] for n in sizes], "o-", label=f"run {r}")
        ax.set_xscale("log")
        ax.set_xlabel("jobs queued before the drain")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("cost of a turn per job" + (
        f": largest / smallest {growth:.2f}x (median)" if growth is not None else ""), fontsize=9)
    axes[1].set_title("the drain's rate", fontsize=9)
    return finish(fig, s)


def security_figure(plt, s):
    """The drain's jobs/s per run, security off and on; the light-load latencies' medians off
    and on."""
    off = s.need("drain_off_jobs_per_s")
    lat = [m.group(1) for m in (re.fullmatch(r"latency_off_(.+)_ms", k) for k in s.rows[0])
           if m and s.has(f"latency_on_{m.group(1)}_ms")]
    fig, axes = figure(plt, s, 2 if lat else 1)
    bars(axes[0], run_ticks(s), [
        ("security off", off),
        (ratio_label("TLS and tokens on", s.median("paired_drain_on_to_off"), "off, paired"),
         s.col("drain_on_jobs_per_s"))], "jobs/s, first dispatch to last finish")
    axes[0].set_title("drain", fontsize=9)
    if lat:
        bars(axes[1], [k.replace("_", " ") for k in lat], [
            ("off", [s.median(f"latency_off_{k}_ms") for k in lat]),
            ("on", [s.median(f"latency_on_{k}_ms") for k in lat])], "ms (median of the runs)")
        axes[1].tick_params(axis="x", labelsize=7)
        axes[1].set_title("latency at light load, both probed at once", fontsize=9)
    return finish(fig, s)


LAB_SYSTEMS = (("baseline", "blocking batches (baseline)"), ("dispatchd", "dispatchd"),
               ("dispatchd_rpm", "dispatchd, rate-limited"))


def lab_figure(plt, s):
    """Each system's makespan per run against the lower bound and its 1.10 target; and the first
    run's completions per second (OUT-series.csv)."""
    systems = [(k, name) for k, name in LAB_SYSTEMS if s.has(f"{k}.makespan_s")]
    if not systems:
        raise PlotError("lab: no *.makespan_s column")
    series_path = s.base + "-series.csv"
    per_second = {}
    if os.path.exists(series_path):
        with open(series_path, newline="") as f:
            for row in csv.DictReader(f):
                if row["run"] == str(s.runs[0]):
                    per_second.setdefault(row["system"], []).append(int(row["completions"]))
    fig, axes = figure(plt, s, 2 if per_second else 1)
    rpm = s.arg("rpm")
    names = {k: f"{name}, {rpm:g} rpm per model" if k == "dispatchd_rpm" and rpm else name
             for k, name in systems}
    bars(axes[0], run_ticks(s), [(names[k], s.col(f"{k}.makespan_s")) for k, _ in systems],
         "makespan, s")
    bound = next((s.col(f"{k}.lower_bound_s") for k, _ in systems if s.has(f"{k}.lower_bound_s")),
                 None)
    if bound:
        for g, b in enumerate(bound):
            if b is not None:
                axes[0].hlines([b, 1.1 * b], g - 0.45, g + 0.45, colors=["k", "r"],
                               linestyles=["-", "--"])
        axes[0].plot([], [], "k-", label="lower bound")
        axes[0].plot([], [], "r--", label="1.10 x the bound")
        legend_below(axes[0])
    axes[0].set_title("makespan of the same tasks", fontsize=9)
    if per_second:
        ax = axes[1]
        for k, counts in per_second.items():
            ax.plot(range(len(counts)), counts, label=names.get(k, k), linewidth=0.9)
        ax.set_xlabel("seconds since the first hand-out")
        ax.set_ylabel("completions in the second")
        ax.set_title(f"run {s.runs[0]}: completions per second", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return finish(fig, s)


FIGURES = {"drain": drain_figure, "latency": latency_figure, "profile": profile_figure,
           "fleet": fleet_figure, "e2e": e2e_figure, "backlog": backlog_figure,
           "retained": retained_figure, "submitted": submitted_figure,
           "turncost": turncost_figure, "security": security_figure, "lab": lab_figure}


# ------------------------------------------------------------------------------------------------
# Any other scenario: its numeric columns, a panel per unit, a bar per run.

UNITS = (("jobs/s and other rates", lambda k: k.endswith("_per_s")),
         ("ms", lambda k: k.endswith("_ms")),
         ("µs", lambda k: k.endswith(("_us_per_job", "_us"))),
         ("ratio", lambda k: k.endswith(("_share", "fraction_of_ceiling")) or "_to_" in k
          or "_over_" in k or "ratio" in k),
         ("s", lambda k: k.endswith(("_s", "seconds"))),
         ("MiB", lambda k: k.endswith("_mib")),
         ("counts, bytes and other", lambda k: True))
GENERIC_COLUMNS = 12  # per panel


def generic_figure(plt, s):
    """Horizontal bars of each numeric column (setup columns left out), one per run, a panel per
    unit; at most GENERIC_COLUMNS per panel, in the CSV's order."""
    keys = [k for k in s.rows[0] if k not in SETUP_COLUMNS and s.has(k)]
    if not keys:
        raise PlotError(f"{s.scenario}: no numeric column to draw")
    panels = []
    for unit, test in UNITS:
        mine = [k for k in keys if test(k)]
        keys = [k for k in keys if k not in mine]
        if mine:
            panels.append((unit, mine))
    heights = [0.6 + 0.32 * len(cols[:GENERIC_COLUMNS]) * max(1, len(s.rows) / 2)
               for _, cols in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (unit, cols) in zip(axes[:, 0], panels):
        shown = cols[:GENERIC_COLUMNS]
        width = 0.8 / len(s.rows)
        for i, r in enumerate(s.runs):
            ys = [g + (i - (len(s.rows) - 1) / 2) * width for g in range(len(shown))]
            vals = [s.col(k)[i] for k in shown]
            drawn = ax.barh(ys, [float("nan") if v is None else v for v in vals], width,
                            label=f"run {r}")
            ax.bar_label(drawn, labels=[fmt(v) for v in vals], fontsize=6, padding=1)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels(shown, fontsize=7)
        ax.invert_yaxis()
        more = len(cols) - len(shown)
        ax.set_title(unit + (f" ({more} more columns in the CSV)" if more else ""), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + (hi - lo) * 0.12)
    axes[0, 0].legend(fontsize=7)
    return finish(fig, s)


# ------------------------------------------------------------------------------------------------


def draw(out, scenario=None, png=None, strict=False):
    """Draws OUT.png from OUT.csv and OUT.json (`out`: the OUT prefix, or either file; `scenario`
    where no OUT.json says it). Returns the PNG's path, or None, after saying how to get it, when
    this interpreter has no matplotlib. Raises PlotError when the files cannot make a figure.
    The scenario's own figure falls back to the generic chart when the CSV lacks its columns,
    unless `strict`."""
    s = Sitting(out, scenario)
    plt = pyplot()
    if plt is None:
        print(f"plots: {missing_matplotlib()}", file=sys.stderr)
        return None
    own = FIGURES.get(s.scenario)
    fig = None
    if own:
        try:
            fig = own(plt, s)
        except PlotError as e:
            plt.close("all")
            if strict:
                raise
            print(f"plots: {e}: drawing the numeric columns instead", file=sys.stderr)
    if fig is None:
        fig = generic_figure(plt, s)
    png = png or s.base + ".png"
    try:
        fig.savefig(png, dpi=90, bbox_inches="tight")
    except OSError as e:
        raise PlotError(f"{png}: {e}")
    finally:
        plt.close(fig)
    return png


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("out", nargs="+", help="OUT.json, OUT.csv or the OUT prefix of a sitting")
    p.add_argument("--scenario", help="the scenario, for a CSV with no OUT.json beside it")
    args = p.parse_args()
    failed = 0
    for out in args.out:
        try:
            png = draw(out, args.scenario)
        except PlotError as e:
            print(f"plots: {e}", file=sys.stderr)
            failed += 1
            continue
        if png is None:
            return 1
        print(f"wrote {png}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
