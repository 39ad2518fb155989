"""/metrics as Prometheus reads it, from a real agent: every line valid text
exposition format (0.0.4), the latency histograms (FUSE requests by op, store
calls, destination requests, restores) observed after real sqlite3 work and a
restore, the build info, and every metric packaging/grafana-dashboard.json
names present."""
import json
import math
import os
import re
import sqlite3
import unittest

from harness import MountTest, slots, tenants_in, wait_for

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "packaging",
                         "grafana-dashboard.json")
TTL_S = 6  # as test_replication: fsync-heavy neighbours must not lapse a lease

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf'^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? (\S+)(?: (-?\d+))?$')
HEADER = re.compile(rf"^# (HELP|TYPE) ({NAME}) (.*)$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def parse_value(text):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise ValueError(f"not a sample value: {text!r}")
    return float(text)


def parse_labels(text):
    out = {}
    for m in re.finditer(rf'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"', text or ""):
        if m.group(1) in out:
            raise ValueError(f"label {m.group(1)} twice in {{{text}}}")
        out[m.group(1)] = m.group(2)
    return out


def family_of(name, types):
    """The family a sample belongs to: a histogram's _bucket, _sum and _count
    are its family's; anything else is its own."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[:-len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            return base
    return name


def parse_exposition(text):
    """Parses Prometheus text format strictly; raises AssertionError naming the
    line on anything invalid. Returns (types, samples): {family: type} and
    [(name, labels, value)] in order."""
    if not text.endswith("\n"):
        raise AssertionError("the exposition does not end with a newline")
    types, helps, samples = {}, set(), []
    seen_families, current = set(), None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}: {line!r}"
        if line.startswith("#"):
            m = HEADER.match(line)
            if not m:
                raise AssertionError(f"{where}: a comment that is neither HELP nor TYPE")
            kind, name, rest = m.groups()
            if kind == "HELP":
                if name in helps:
                    raise AssertionError(f"{where}: HELP of {name} twice")
                helps.add(name)
            else:
                if name in types:
                    raise AssertionError(f"{where}: TYPE of {name} twice")
                if rest not in TYPES:
                    raise AssertionError(f"{where}: unknown type {rest}")
                if name in seen_families:
                    raise AssertionError(f"{where}: TYPE of {name} after its samples")
                types[name] = rest
            continue
        m = SAMPLE.match(line)
        if not m:
            raise AssertionError(f"{where}: not a valid sample line")
        name, labels, value, _ = m.groups()
        try:
            labels = parse_labels(labels)
            value = parse_value(value)
        except ValueError as e:
            raise AssertionError(f"{where}: {e}")
        family = family_of(name, types)
        # A family's samples are one block.
        if family != current and family in seen_families:
            raise AssertionError(f"{where}: samples of {family} are not together")
        current = family
        seen_families.add(family)
        if types.get(family) == "histogram" and name == family:
            raise AssertionError(f"{where}: a histogram sample without _bucket/_sum/_count")
        if types.get(family) == "histogram" and name.endswith("_bucket") and "le" not in labels:
            raise AssertionError(f"{where}: a bucket without le")
        if types.get(family) == "counter" and (value < 0 or math.isnan(value)):
            raise AssertionError(f"{where}: a counter below 0")
        samples.append((name, labels, value))
    for family in sorted(seen_families):
        if family not in types or family not in helps:
            raise AssertionError(f"{family}: samples without both HELP and TYPE")
    return types, samples


def check_histograms(types, samples):
    """Every histogram: buckets in rising le, cumulative counts that never go
    down, +Inf last, _count equal to the +Inf bucket, a _sum. Returns
    {(family, labels without le as a tuple): count}."""
    series = {}
    for name, labels, value in samples:
        family = family_of(name, types)
        if types.get(family) != "histogram":
            continue
        key = (family, tuple(sorted((k, v) for k, v in labels.items() if k != "le")))
        s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if name.endswith("_bucket"):
            s["buckets"].append((parse_value(labels["le"]), value))
        elif name.endswith("_sum"):
            s["sum"] = value
        else:
            s["count"] = value
    counts = {}
    family_les = {}
    for key, s in series.items():
        les = [le for le, _ in s["buckets"]]
        # histogram_quantile over a family sums buckets by le: one le set.
        first = family_les.setdefault(key[0], (key, les))
        if first[1] != les:
            raise AssertionError(f"{key}: le bounds {les} differ from {first[0]}'s {first[1]}")
        if les != sorted(les) or len(set(les)) != len(les):
            raise AssertionError(f"{key}: le bounds not rising: {les}")
        if not les or les[-1] != math.inf:
            raise AssertionError(f"{key}: no +Inf bucket last")
        values = [v for _, v in s["buckets"]]
        if any(b < a for a, b in zip(values, values[1:])):
            raise AssertionError(f"{key}: bucket counts not cumulative: {values}")
        if s["count"] is None or s["sum"] is None:
            raise AssertionError(f"{key}: no _count or _sum")
        if s["count"] != values[-1]:
            raise AssertionError(f"{key}: _count {s['count']} != +Inf bucket {values[-1]}")
        if s["sum"] < 0 or (s["count"] == 0 and s["sum"] != 0):
            raise AssertionError(f"{key}: _sum {s['sum']} with _count {s['count']}")
        counts[key] = s["count"]
    return counts


def dashboard_expressions(doc):
    """Every PromQL text of a Grafana dashboard: panel targets (rows' panels
    too) and templating queries."""
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))
    walk(doc.get("panels", []))
    for var in doc.get("templating", {}).get("list", []):
        q = var.get("query")
        out.append(q.get("query", "") if isinstance(q, dict) else q or "")
        out.append(var.get("definition", ""))
    return out


def missing_metrics(doc, types, samples):
    """The fleetfs_ names the dashboard's expressions use that the exposition
    lacks. A name must be a sample name there; one ending in _bucket, _sum or
    _count must also be a sample of a histogram family (not a made-up name
    whose stem happens to be one)."""
    names = {name for name, _, _ in samples}
    missing = set()
    for expr in dashboard_expressions(doc):
        for name in re.findall(r"fleetfs_[a-z0-9_]+", expr):
            if name not in names:
                missing.add(name)
                continue
            for suffix in HISTOGRAM_SUFFIXES:
                stem = name[:-len(suffix)]
                if name.endswith(suffix) and stem in types and types[stem] != "histogram":
                    missing.add(name)
    return sorted(missing)


# Labels Prometheus adds to every scraped series: not in /metrics.
TARGET_LABELS = {"instance", "job"}
AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|topk|bottomk|quantile|stddev|stdvar)\s*"
                         r"(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def closing_paren(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {text!r}")


def aggregations(expr):
    """(start, end, kind, labels) of each aggregation: prefix `sum by (a) (X)`
    or suffix `sum(X) by (a)`; kind None when it has neither by nor without."""
    out = []
    for m in AGGREGATION.finditer(expr):
        end = closing_paren(expr, m.end() - 1)
        kind, labels = m.group(2), m.group(3)
        if kind is None:
            suffix = re.match(r"\s*(by|without)\s*\(([^)]*)\)", expr[end + 1:])
            if suffix:
                kind, labels = suffix.group(1), suffix.group(2)
        names = {x.strip() for x in (labels or "").split(",") if x.strip()}
        out.append((m.start(), end, kind, names))
    return out


def label_errors(doc, samples):
    """What the dashboard's expressions get wrong about labels: a selector or
    by/without label that none of the metrics named in the expression carry
    (but Prometheus' target labels), label_values of a missing label, and a
    histogram_quantile whose aggregations do not keep le."""
    labels_of = {}
    for name, labels, _ in samples:
        labels_of.setdefault(name, set()).update(labels)
    errors = []
    for expr in dashboard_expressions(doc):
        named = set(re.findall(r"fleetfs_[a-z0-9_]+", expr))
        available = set(TARGET_LABELS)
        for name in named:
            available |= labels_of.get(name, set())
        for m in re.finditer(r"(fleetfs_[a-z0-9_]+)\s*\{([^}]*)\}", expr):
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)):
                if label not in TARGET_LABELS and label not in labels_of.get(m.group(1), set()):
                    errors.append(f"{expr}: {m.group(1)} has no label {label}")
        for m in re.finditer(r"label_values\(\s*(fleetfs_[a-z0-9_]+)\s*,\s*(\w+)\s*\)", expr):
            if m.group(2) not in TARGET_LABELS | labels_of.get(m.group(1), set()):
                errors.append(f"{expr}: {m.group(1)} has no label {m.group(2)}")
        aggs = aggregations(expr)
        for _, _, kind, names in aggs:
            for label in sorted(names - available):
                errors.append(f"{expr}: {kind} ({label}) but no metric here has it")
        for m in re.finditer(r"histogram_quantile\s*\(", expr):
            end = closing_paren(expr, m.end() - 1)
            for start, _, kind, names in aggs:
                if not m.end() <= start < end:
                    continue
                if kind != "by" or "le" not in names:
                    errors.append(f"{expr}: an aggregation in histogram_quantile drops le")
    return errors


class Metrics(MountTest):
    TIME_LIMIT = 240

    def ragent(self, name):
        return self.agent(name, ttl=f"{TTL_S}s",
                          extra=["--replica", f"file://{self.root}/replica",
                                 "--sync-interval", "200ms"])

    def scrape(self, agent):
        status, text = agent.http("/metrics")
        self.assertEqual(status, 200, text)
        return text

    def wait_shipped(self, agent):
        def done():
            rep = agent.status()["replication"]
            return rep["tenants_unshipped"] == 0 and all(
                r["replication_lag_s"] == 0 for r in agent.status()["ranges"])
        wait_for(done, 15, f"{agent.name}: everything shipped", poll=0.05, on_fail=agent.log_tail)

    def test_metrics_parse_histograms_are_observed_and_the_dashboard_names_only_real_metrics(self):
        tenant = tenants_in(0, 16383, 1, prefix="metrics")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        a = self.ragent("a").start()
        a.wait_states("serving")
        db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
        db.execute("PRAGMA journal_mode=wal")
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB)")
        for i in range(20):
            db.execute("INSERT INTO t(pad) VALUES (randomblob(500))")
        db.close()
        self.wait_shipped(a)
        self.assertEqual(a.stop(), 0)
        # Lost while the agent was down: the next start restores it.
        for suffix in ("", "-wal", "-shm"):
            path = os.path.join(a.backing, rel + suffix)
            if os.path.exists(path):
                os.unlink(path)
        a.start()
        a.wait_states("serving")
        db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
        self.assertEqual(db.execute("SELECT count(*) FROM t").fetchone()[0], 20)
        db.execute("INSERT INTO t(pad) VALUES (randomblob(500))")
        db.close()
        self.wait_shipped(a)

        text = self.scrape(a)
        types, samples = parse_exposition(text)
        counts = check_histograms(types, samples)

        def count(family, **labels):
            return counts.get((family, tuple(sorted(labels.items()))), 0)
        for family in ("fleetfs_fuse_request_duration_seconds",
                       "fleetfs_store_call_duration_seconds",
                       "fleetfs_replica_request_duration_seconds",
                       "fleetfs_restore_duration_seconds"):
            self.assertEqual(types.get(family), "histogram", family)
        self.assertGreaterEqual(count("fleetfs_restore_duration_seconds"), 1, text)
        # Restores and calls reach 5 minutes; FUSE requests stop at 10 s.
        les = {(family_of(n, types), l["le"]) for n, l, _ in samples if "le" in l}
        self.assertIn(("fleetfs_restore_duration_seconds", "300"), les)
        self.assertIn(("fleetfs_store_call_duration_seconds", "300"), les)
        self.assertNotIn(("fleetfs_fuse_request_duration_seconds", "300"), les)
        for op in ("lookup", "open", "read", "write", "getattr"):
            self.assertGreater(count("fleetfs_fuse_request_duration_seconds", op=op), 0, op)
        self.assertGreater(count("fleetfs_store_call_duration_seconds", call="claim"), 0)
        for kind in ("list", "get", "create"):
            self.assertGreater(count("fleetfs_replica_request_duration_seconds", kind=kind), 0,
                               kind)
        info = [labels for name, labels, value in samples
                if name == "fleetfs_build_info" and value == 1]
        self.assertEqual(len(info), 1, text)
        self.assertEqual(sorted(info[0]), ["commit", "compiler", "version"])
        self.assertRegex(info[0]["version"], r"^\d+\.\d+\.\d+")
        self.assertRegex(info[0]["commit"], r"^([0-9a-f]{7,}|unknown)$")
        self.assertTrue(info[0]["compiler"])

        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        self.assertGreater(len(dashboard_expressions(dashboard)), 10)
        self.assertEqual(missing_metrics(dashboard, types, samples), [],
                         "packaging/grafana-dashboard.json names metrics /metrics lacks")
        self.assertEqual(label_errors(dashboard, samples), [],
                         "packaging/grafana-dashboard.json uses labels /metrics lacks")


class DashboardCheck(unittest.TestCase):
    """The checks above, on texts made here: each can fail."""

    TEXT = ("# HELP fleetfs_x_seconds X.\n# TYPE fleetfs_x_seconds histogram\n"
            'fleetfs_x_seconds_bucket{op="a",le="0.1"} 1\n'
            'fleetfs_x_seconds_bucket{op="a",le="+Inf"} 2\n'
            'fleetfs_x_seconds_sum{op="a"} 0.5\nfleetfs_x_seconds_count{op="a"} 2\n'
            "# HELP fleetfs_y_total Y.\n# TYPE fleetfs_y_total counter\nfleetfs_y_total 3\n")

    def test_a_dashboard_naming_a_metric_that_is_not_there_is_caught(self):
        types, samples = parse_exposition(self.TEXT)
        doc = {"panels": [{"type": "row", "panels": [{"targets": [
            {"expr": "histogram_quantile(0.99, rate(fleetfs_x_seconds_bucket[5m]))"},
            {"expr": "rate(fleetfs_y_total[5m]) + fleetfs_nonexistent_total"},
            {"expr": "fleetfs_x_seconds"},  # a histogram family has no series of its own
            {"expr": "fleetfs_y_total_count"}]}]}]}
        self.assertEqual(missing_metrics(doc, types, samples),
                         ["fleetfs_nonexistent_total", "fleetfs_x_seconds",
                          "fleetfs_y_total_count"])

    def test_a_dashboard_using_a_label_that_is_not_there_or_dropping_le_is_caught(self):
        types, samples = parse_exposition(self.TEXT)
        good = [
            "histogram_quantile(0.99, sum by (le, op) (rate(fleetfs_x_seconds_bucket{instance=~\"$i\", op=\"a\"}[5m])))",
            "sum(rate(fleetfs_x_seconds_bucket[5m])) by (le)",
            "sum by (instance) (fleetfs_y_total)",
            "label_values(fleetfs_x_seconds_count, op)",
        ]
        bad = [
            "histogram_quantile(0.99, sum by (op) (rate(fleetfs_x_seconds_bucket[5m])))",
            "histogram_quantile(0.99, sum(rate(fleetfs_x_seconds_bucket[5m])))",
            "histogram_quantile(0.99, sum(rate(fleetfs_x_seconds_bucket[5m])) by (op))",
            "fleetfs_y_total{op=\"a\"}",
            "sum by (kind) (fleetfs_x_seconds_count)",
            "label_values(fleetfs_y_total, op)",
        ]
        def doc(exprs):
            return {"panels": [{"targets": [{"expr": e} for e in exprs]}]}
        self.assertEqual(label_errors(doc(good), samples), [])
        for expr in bad:
            self.assertEqual(len(label_errors(doc([expr]), samples)), 1, expr)

    def test_a_family_without_help_or_type_or_with_two_le_sets_is_refused(self):
        for drop in ("# HELP fleetfs_y_total Y.\n", "# TYPE fleetfs_y_total counter\n"):
            with self.assertRaises(AssertionError, msg=drop):
                parse_exposition(self.TEXT.replace(drop, ""))
        two_sets = self.TEXT.replace(
            'fleetfs_x_seconds_sum{op="a"}',
            'fleetfs_x_seconds_bucket{op="b",le="+Inf"} 0\n'
            'fleetfs_x_seconds_sum{op="b"} 0\nfleetfs_x_seconds_count{op="b"} 0\n'
            'fleetfs_x_seconds_sum{op="a"}')
        with self.assertRaises(AssertionError):
            check_histograms(*parse_exposition(two_sets))

    def test_the_real_dashboard_names_fleetfs_metrics(self):
        with open(DASHBOARD) as f:
            doc = json.load(f)
        names = set(re.findall(r"fleetfs_[a-z0-9_]+", " ".join(dashboard_expressions(doc))))
        for must in ("fleetfs_ranges_held", "fleetfs_range_lease_seconds_left",
                     "fleetfs_fences_total", "fleetfs_range_replication_lag_seconds",
                     "fleetfs_replication_restores_total", "fleetfs_fuse_errors_total",
                     "fleetfs_fuse_request_duration_seconds_bucket",
                     "fleetfs_store_call_duration_seconds_bucket",
                     "fleetfs_restore_duration_seconds_bucket"):
            self.assertIn(must, names)

    def test_invalid_lines_and_broken_histograms_are_refused(self):
        for bad in ("fleetfs_y_total 3 4 5\n", "fleetfs y 1\n", "fleetfs_y{a=b} 1\n",
                    "# TYPE fleetfs_y_total counter\n# TYPE fleetfs_y_total counter\n",
                    "fleetfs_y_total 1", "# random comment\n"):
            with self.assertRaises(AssertionError, msg=bad):
                parse_exposition(bad)
        broken = self.TEXT.replace('le="+Inf"} 2', 'le="+Inf"} 0')  # not cumulative
        with self.assertRaises(AssertionError):
            check_histograms(*parse_exposition(broken))
        miscounted = self.TEXT.replace('_count{op="a"} 2', '_count{op="a"} 3')
        with self.assertRaises(AssertionError):
            check_histograms(*parse_exposition(miscounted))
        self.assertEqual(check_histograms(*parse_exposition(self.TEXT)),
                         {("fleetfs_x_seconds", (("op", "a"),)): 2})


if __name__ == "__main__":
    unittest.main()
