//! Prometheus metrics, served at `GET /metrics` in the OpenMetrics text format.
//!
//! Built on `prometheus-client` (the Prometheus project's crate) with an
//! explicit [`Registry`] held in the app state rather than a process-global
//! recorder: tests can build many apps side by side, and nothing is recorded
//! behind the caller's back.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `keyturn_actions_total` | counter | `outcome` = `succeeded` \| `failed` \| `retry` \| `unknown` \| `invalidated` | one per dispatch attempt: the classified provider outcome, or `invalidated` when `begin_dispatch` said no |
//! | `keyturn_dispatch_seconds` | histogram | — | provider call latency (request sent → outcome classified) |
//! | `keyturn_lease_batch_size` | histogram | — | jobs returned by one non-empty `keyturn.lease` call |
//! | `keyturn_uncertain` | gauge | — | rows in `keyturn.uncertain_actions()`, refreshed after each sweep (needs `keyturn_operator`; stays at its last value otherwise) |
//! | `keyturn_sweep_total` | counter | `kind` = `expired` \| `requeued` \| `uncertain` | rows moved by `keyturn.sweep()` |
//! | `keyturn_db_reconnects_total` | counter | `conn` = `listen` \| `pool` \| `rpc` | database connections found broken and replaced |
//! | `keyturn_handbacks_total` | counter | `reason` = `lease_too_short` \| `shutdown` \| `unknown_provider` | leased jobs handed back (`complete 'retry'` before `begin_dispatch`) |
//! | `keyturn_unrecorded_outcomes_total` | counter | — | observed outcomes `complete` could not record (database unreachable past the lease, or the action already `uncertain`); each one is logged for the operator |
//! | `keyturn_notify_stalled` | gauge | — | 1 while the heartbeat `NOTIFY` sent through the pool does not reach the `LISTEN` connection (wake-ups then come only from polling), else 0 |
//! | `keyturn_notify_heartbeats_total` | counter | `result` = `received` \| `missed` \| `unsent` | heartbeats by what became of them: arrived in time, did not, or could not be sent (the pool failed) |
//! | `keyturn_journal_records_total` | counter | `kind` = `outcome` \| `ack` | records appended to the outcome journal |
//! | `keyturn_journal_fsync_seconds` | histogram | — | one durable journal write (a batch's `fdatasync`, or a rewrite of the file) |
//! | `keyturn_journal_bytes` | gauge | — | the journal file's size |
//! | `keyturn_journal_errors_total` | counter | — | journal writes that failed (logged; no job is leased until the file can be rewritten) |
//! | `keyturn_journal_replayed_total` | counter | `result` = `recorded` \| `refused` | outcomes found in the journal at start and sent to `complete`: recorded, or refused for good (logged for the operator) |
//! | `keyturn_mcp_calls_total` | counter | `kind` = `write` \| `read` \| `upstream_read` \| `status` \| `task` \| `upstream`, `outcome` | `/mcp` tool calls by kind and outcome (`proposed`, `resumed`: a 2026-07-28 client's retry after `input_required`, `read`, `refused`, `error`; a task's `created`, `read`, `updated`, `refused`, `error`), and the `mcp` provider's upstream calls (`succeeded`, `failed`, `retry`, `unknown`, `invalidated`) |
//! | `keyturn_mcp_upstream_up` | gauge | `upstream` | 1 while the upstream MCP server answered its last `tools/list`, else 0 |

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label set `{outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome word.
    pub outcome: &'static str,
}

/// Label set `{kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The sweep column, or the kind of journal record.
    pub kind: &'static str,
}

/// Label set `{conn}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnLabel {
    /// `listen`, `pool` or `rpc`.
    pub conn: &'static str,
}

/// Label set `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// What became of it (a heartbeat, a replayed outcome).
    pub result: &'static str,
}

/// Label set `{kind, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpCallLabel {
    /// What was called.
    pub kind: &'static str,
    /// What came of it.
    pub outcome: &'static str,
}

/// Label set `{upstream}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    /// The upstream's configured name.
    pub upstream: String,
}

/// Label set `{reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the job was handed back.
    pub reason: &'static str,
}

/// Every metric keyturnd exports. Cloning the handles is cheap (they are
/// `Arc`s inside), so the struct is shared behind one `Arc`.
pub struct Metrics {
    registry: Registry,
    /// `keyturn_actions_total{outcome}`.
    pub actions: Family<OutcomeLabel, Counter>,
    /// `keyturn_dispatch_seconds`.
    pub dispatch_seconds: Histogram,
    /// `keyturn_lease_batch_size`.
    pub lease_batch_size: Histogram,
    /// `keyturn_uncertain`.
    pub uncertain: Gauge,
    /// `keyturn_sweep_total{kind}`.
    pub sweep: Family<KindLabel, Counter>,
    /// `keyturn_db_reconnects_total{conn}`.
    pub db_reconnects: Family<ConnLabel, Counter>,
    /// `keyturn_handbacks_total{reason}`.
    pub handbacks: Family<ReasonLabel, Counter>,
    /// `keyturn_unrecorded_outcomes_total`.
    pub unrecorded: Counter,
    /// `keyturn_notify_stalled`.
    pub notify_stalled: Gauge,
    /// `keyturn_notify_heartbeats_total{result}`.
    pub notify_heartbeats: Family<ResultLabel, Counter>,
    /// `keyturn_journal_records_total{kind}`.
    pub journal_records: Family<KindLabel, Counter>,
    /// `keyturn_journal_fsync_seconds`.
    pub journal_fsync_seconds: Histogram,
    /// `keyturn_journal_bytes`.
    pub journal_bytes: Gauge,
    /// `keyturn_journal_errors_total`.
    pub journal_errors: Counter,
    /// `keyturn_journal_replayed_total{result}`.
    pub journal_replayed: Family<ResultLabel, Counter>,
    /// `keyturn_mcp_calls_total{kind, outcome}`.
    pub mcp_calls: Family<McpCallLabel, Counter>,
    /// `keyturn_mcp_upstream_up{upstream}`.
    pub mcp_upstream_up: Family<UpstreamLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let actions = Family::<OutcomeLabel, Counter>::default();
        // 5 ms … ~41 s: from a loopback webhook to a call that used its
        // whole timeout.
        let dispatch_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        // 1, 2, 4 … 1024: KEYTURN_WORKERS is at most 1024.
        let lease_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        let uncertain = Gauge::default();
        let sweep = Family::<KindLabel, Counter>::default();
        let db_reconnects = Family::<ConnLabel, Counter>::default();
        let handbacks = Family::<ReasonLabel, Counter>::default();
        let unrecorded = Counter::default();
        let notify_stalled = Gauge::default();
        let notify_heartbeats = Family::<ResultLabel, Counter>::default();
        let journal_records = Family::<KindLabel, Counter>::default();
        // 50 µs … ~0.8 s: from a battery-backed cache to a struggling disk.
        let journal_fsync_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
        let journal_bytes = Gauge::default();
        let journal_errors = Counter::default();
        let journal_replayed = Family::<ResultLabel, Counter>::default();
        let mcp_calls = Family::<McpCallLabel, Counter>::default();
        let mcp_upstream_up = Family::<UpstreamLabel, Gauge>::default();

        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "keyturn_actions",
            "Dispatch attempts by outcome",
            actions.clone(),
        );
        registry.register(
            "keyturn_dispatch_seconds",
            "Provider call latency in seconds",
            dispatch_seconds.clone(),
        );
        registry.register(
            "keyturn_lease_batch_size",
            "Jobs returned by one non-empty keyturn.lease call",
            lease_batch_size.clone(),
        );
        registry.register(
            "keyturn_uncertain",
            "Actions waiting in keyturn.uncertain_actions() for an operator",
            uncertain.clone(),
        );
        registry.register(
            "keyturn_sweep",
            "Rows moved by keyturn.sweep() by kind",
            sweep.clone(),
        );
        registry.register(
            "keyturn_db_reconnects",
            "Database connections found broken and replaced",
            db_reconnects.clone(),
        );
        registry.register(
            "keyturn_handbacks",
            "Leased jobs handed back before begin_dispatch, by reason",
            handbacks.clone(),
        );
        registry.register(
            "keyturn_unrecorded_outcomes",
            "Observed provider outcomes that complete could not record",
            unrecorded.clone(),
        );
        registry.register(
            "keyturn_notify_stalled",
            "1 while heartbeat NOTIFYs sent through the pool do not reach the LISTEN connection",
            notify_stalled.clone(),
        );
        registry.register(
            "keyturn_notify_heartbeats",
            "Heartbeat NOTIFYs by result: received in time, missed, or unsent",
            notify_heartbeats.clone(),
        );

        registry.register(
            "keyturn_journal_records",
            "Records appended to the outcome journal, by kind",
            journal_records.clone(),
        );
        registry.register(
            "keyturn_journal_fsync_seconds",
            "Durable outcome journal writes (one per batch) in seconds",
            journal_fsync_seconds.clone(),
        );
        registry.register(
            "keyturn_journal_bytes",
            "Size of the outcome journal file",
            journal_bytes.clone(),
        );
        registry.register(
            "keyturn_journal_errors",
            "Outcome journal writes that failed",
            journal_errors.clone(),
        );
        registry.register(
            "keyturn_journal_replayed",
            "Outcomes replayed from the journal at start, by result",
            journal_replayed.clone(),
        );
        registry.register(
            "keyturn_mcp_calls",
            "MCP tool calls by kind and outcome",
            mcp_calls.clone(),
        );
        registry.register(
            "keyturn_mcp_upstream_up",
            "Whether each upstream MCP server answered its last tools/list",
            mcp_upstream_up.clone(),
        );

        // Touch the fixed label values so every series exists from the first
        // scrape: a rate() over a series that appears late misses its start.
        for outcome in ["succeeded", "failed", "retry", "unknown", "invalidated"] {
            let _ = actions.get_or_create(&OutcomeLabel { outcome });
        }
        for kind in ["expired", "requeued", "uncertain"] {
            let _ = sweep.get_or_create(&KindLabel { kind });
        }
        for conn in ["listen", "pool", "rpc"] {
            let _ = db_reconnects.get_or_create(&ConnLabel { conn });
        }
        for reason in ["lease_too_short", "shutdown", "unknown_provider"] {
            let _ = handbacks.get_or_create(&ReasonLabel { reason });
        }
        for result in ["received", "missed", "unsent"] {
            let _ = notify_heartbeats.get_or_create(&ResultLabel { result });
        }
        for kind in ["outcome", "ack"] {
            let _ = journal_records.get_or_create(&KindLabel { kind });
        }
        for result in ["recorded", "refused"] {
            let _ = journal_replayed.get_or_create(&ResultLabel { result });
        }

        Metrics {
            registry,
            actions,
            dispatch_seconds,
            lease_batch_size,
            uncertain,
            sweep,
            db_reconnects,
            handbacks,
            unrecorded,
            notify_stalled,
            notify_heartbeats,
            journal_records,
            journal_fsync_seconds,
            journal_bytes,
            journal_errors,
            journal_replayed,
            mcp_calls,
            mcp_upstream_up,
        }
    }

    /// Counts one MCP call of `kind` by its `outcome`.
    pub fn mcp_call(&self, kind: &'static str, outcome: &'static str) {
        self.mcp_calls
            .get_or_create(&McpCallLabel { kind, outcome })
            .inc();
    }

    /// Counts one attempt's outcome.
    pub fn action(&self, outcome: &'static str) {
        self.actions.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts one hand-back.
    pub fn handback(&self, reason: &'static str) {
        self.handbacks.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts one replayed outcome.
    pub fn replayed(&self, result: &'static str) {
        self.journal_replayed
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one replaced connection.
    pub fn reconnect(&self, conn: &'static str) {
        self.db_reconnects.get_or_create(&ConnLabel { conn }).inc();
    }

    /// Counts one heartbeat by what became of it.
    pub fn heartbeat(&self, result: &'static str) {
        self.notify_heartbeats
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(4096);
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
