//! The crash soak: approved webhook and smtp actions drained by keyturnd
//! while a driver SIGKILLs keyturnd at random moments (starting a new one at
//! once, on the same journal directory) and restarts PostgreSQL with
//! `pg_ctl restart -m immediate`. Then every action is checked:
//!
//! - it reached a terminal status, or is queued and not yet due;
//! - the receivers saw at most one request per idempotency key, plus one
//!   per attempt recorded `retry` (the provider refused it, or it was never
//!   sent);
//! - it is `uncertain` only if its attempt was begun by a keyturnd that was
//!   then killed (the call was in flight at a kill), or one that logged that
//!   it gave up recording it; an uncertain action is never re-sent;
//! - one `keyturn.usage` row if `succeeded`, none otherwise;
//! - its events form one chain, one event per status change, from
//!   `pending` to its status, with one `executing` per attempt.
//!
//! It prints the counts. Run by the `soak` layer of `tests/run-all` (which
//! gives it a cluster of its own with `synchronous_commit = on`: with it off
//! an immediate restart loses commits keyturnd was told had happened, and
//! the soak would rightly find the duplicates that causes). Behind a switch,
//! since it restarts the cluster it is given:
//!
//! ```text
//! KT_SOAK=short   at least 20 kills, 3 restarts, 240 actions (the soak layer's default)
//! KT_SOAK=long    200 kills (20 of them after a SIGSTOP past the lease), 20 restarts, 2,000 actions
//! KT_SOAK_JOURNAL=off   keyturnd without its outcome journal (to measure what it saves)
//! KT_SOAK_REPORT=<file> the counts, also written there
//! ```
//!
//! Nothing here depends on timing to pass: the kills land where they land,
//! and the invariants hold wherever that is. The counts vary from run to run.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::e2e::{self, Keyturnd, Pick, Receiver, Reply, World};
use crate::support::fake_smtp::{self, Script};
use crate::support::{random_below, random_duration};
use serde_json::json;
use uuid::Uuid;

/// The run's size.
#[derive(Clone, Copy, Debug)]
struct Plan {
    actions: usize,
    kills: usize,
    restarts: usize,
    /// Kills preceded by a SIGSTOP past the lease (issue 34).
    pauses: usize,
}

impl Plan {
    fn from_env(mode: &str) -> Option<Plan> {
        match mode {
            "short" => Some(Plan {
                actions: 240,
                kills: 24,
                restarts: 4,
                pauses: 0,
            }),
            "long" => Some(Plan {
                actions: 2000,
                kills: 200,
                restarts: 20,
                pauses: 20,
            }),
            _ => None,
        }
    }
}

/// The longest random pause from the start of a cycle to its kill (about
/// the time a cycle's actions take to approve and deliver), and from the
/// start of a restart to the kill.
const MAX_GAP: Duration = Duration::from_millis(400);
/// The receivers' longest answer time (uniform from 0).
const MAX_ANSWER: Duration = Duration::from_millis(50);
/// One first request in this many is answered 429 (`Retry-After: 1`).
const REFUSE_ONE_IN: u64 = 20;
/// How long a paused keyturnd stays stopped: past its 6 s lease, so that the
/// sweep (run by the driver meanwhile) makes its calls in flight `uncertain`
/// and, on SIGCONT, its lease has lapsed (a fault injected, not a bound).
const PAUSE: Duration = Duration::from_secs(7);
/// How long the last keyturnd gets to settle everything after the chaos: a
/// bound on waiting for a state, never a timing assertion.
const SETTLE_WITHIN: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Webhook,
    Smtp,
}

struct Approved {
    id: Uuid,
    key: String,
    kind: Kind,
}

/// One keyturnd of the run.
struct Proc {
    worker: String,
    keyturnd: Keyturnd,
    /// When it was sent SIGKILL.
    killed: Option<Instant>,
    /// Whether that was while PostgreSQL was restarting.
    in_restart: bool,
}

impl Proc {
    async fn kill(&mut self) {
        self.killed = Some(Instant::now());
        self.keyturnd.kill9().await;
    }
}

fn soak_reply() -> Pick {
    Arc::new(|nth| {
        if nth == 0 && random_below(REFUSE_ONE_IN) == 0 {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::status(200).delay(random_duration(MAX_ANSWER))
        }
    })
}

fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

// Two threads: the receivers answer (and time their answers) while the
// driver approves and kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_crash_soak() {
    let Ok(mode) = std::env::var("KT_SOAK") else {
        say(&format!(
            "\n*** SKIPPED {}: KT_SOAK is not set (short or long): the soak restarts the cluster it \
             is given, so it runs only when asked. Run it with `KT_ONLY=soak tests/run-all` \
             (`KT_SOAK=long` for the long run). ***\n",
            test_name!()
        ));
        crate::support::note_skip(test_name!(), "KT_SOAK is not set");
        return;
    };
    let plan = Plan::from_env(&mode).expect("KT_SOAK must be short or long");
    let port = require_db!();
    assert!(
        std::env::var("KT_PGDATA").is_ok(),
        "the soak restarts the cluster: set KT_PGDATA (and KT_PGSOCK)"
    );
    let journal_on = std::env::var("KT_SOAK_JOURNAL").as_deref() != Ok("off");
    let _serial = e2e::serial().await;
    let mut w = World::new(port).await;
    let sync: String = w
        .superuser
        .query_one("SHOW synchronous_commit", &[])
        .await
        .expect("SHOW")
        .get(0);
    assert_eq!(
        sync, "on",
        "the soak needs synchronous_commit = on: with it off, an immediate restart loses commits \
         keyturnd was told had happened (start the cluster with `kt_cluster_start synchronous_commit=on`, \
         as the soak layer does)"
    );

    let hook = w.webhook_tool(json!({})).await;
    let mail = w.smtp_tool("soak_mail").await;
    let rx = Receiver::start_with(&w.tenant, soak_reply()).await;
    let (smtp_addr, smtp) = fake_smtp::start_with_delay(Script::default(), MAX_ANSWER).await;
    let journal = tempfile::tempdir().expect("journal dir");
    let mut env = rx.env();
    env.extend([
        (
            "KEYTURN_SMTP_URL",
            format!("smtp://127.0.0.1:{}", smtp_addr.port()),
        ),
        ("KEYTURN_SMTP_FROM", "keyturn <soak@keyturn.test>".into()),
        ("KEYTURN_HTTP_TIMEOUT_SECONDS", "2".into()),
        ("KEYTURN_LEASE_SECONDS", "6".into()),
        ("KEYTURN_SWEEP_SECONDS", "1".into()),
        ("KEYTURN_POLL_MS", "100".into()),
        ("KEYTURN_WORKERS", "8".into()),
        (
            "KEYTURN_JOURNAL_DIR",
            journal.path().to_string_lossy().into_owned(),
        ),
        ("KEYTURN_JOURNAL", journal_on.to_string()),
    ]);
    let spawn = |n: usize| {
        let worker = format!("soak-{n}");
        let mut env = env.clone();
        env.push(("KEYTURN_WORKER_NAME", worker.clone()));
        Proc {
            worker,
            keyturnd: Keyturnd::spawn(port, env),
            killed: None,
            in_restart: false,
        }
    };

    say(&format!(
        "soak ({mode}): {} actions, {} kills ({} paused first), {} restarts, journal {}",
        plan.actions,
        plan.kills,
        plan.pauses,
        plan.restarts,
        if journal_on { "on" } else { "off" }
    ));
    let mut procs = vec![spawn(0)];
    let mut approved: Vec<Approved> = Vec::with_capacity(plan.actions);
    let per_cycle = plan.actions.div_ceil(plan.kills);
    let restart_every = plan.kills / plan.restarts.max(1);
    let pause_every = plan.kills / plan.pauses.max(1);
    let (mut restarts, mut pauses) = (0, 0);
    for cycle in 0..plan.kills {
        let restart = restarts < plan.restarts && cycle % restart_every == restart_every / 2;
        let pause = !restart && pauses < plan.pauses && cycle % pause_every == pause_every / 3;
        pauses += usize::from(pause);
        let victim = procs.pop().expect("a keyturnd");
        // A plain kill lands at a random moment while this cycle's actions
        // are being approved and dispatched. A paused one is first stopped
        // there (SIGSTOP) for longer than its lease while another
        // dispatcher's sweep runs, then resumed (SIGCONT), then killed a
        // moment later: on resuming it must start no call under a lapsed
        // lease (issue 34).
        let (killer, mut kept) = if restart {
            (None, Some(victim))
        } else {
            let delay = random_duration(MAX_GAP);
            let mut victim = victim;
            let killer = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if pause {
                    victim.keyturnd.signal("-STOP");
                    tokio::time::sleep(PAUSE).await;
                    let sweeper = e2e::connect(port, "app_dispatcher").await;
                    let _ = sweeper.execute("SELECT keyturn.sweep()", &[]).await;
                    victim.keyturnd.signal("-CONT");
                    tokio::time::sleep(random_duration(MAX_GAP)).await;
                }
                victim.kill().await;
                victim
            });
            (Some(killer), None)
        };
        for _ in 0..per_cycle {
            if approved.len() == plan.actions {
                break;
            }
            let n = approved.len();
            let (tool, kind, params) = if n.is_multiple_of(2) {
                (&hook, Kind::Webhook, json!({"text": format!("soak {n}")}))
            } else {
                (
                    &mail,
                    Kind::Smtp,
                    json!({"to": "ops@example.com", "subject": format!("soak {n}"), "body": "soak\n"}),
                )
            };
            let q = w.queue(tool, params, false).await;
            approved.push(Approved {
                id: q.id,
                key: q.idempotency_key,
                kind,
            });
        }
        let victim = match killer {
            Some(killer) => killer.await.expect("the kill"),
            None => {
                let mut victim = kept.take().expect("kept for the restart");
                // The database goes down under a working keyturnd with calls
                // in flight, and keyturnd dies at a random moment while it is
                // down or recovering: the outcomes it observed meanwhile are
                // what the journal keeps.
                tokio::time::sleep(random_duration(MAX_GAP / 4)).await;
                let restarted = tokio::task::spawn_blocking(|| e2e::restart_postgres("immediate"));
                tokio::time::sleep(random_duration(MAX_GAP)).await;
                victim.kill().await;
                victim.in_restart = true;
                restarted.await.expect("pg_ctl restart");
                restarts += 1;
                w.reconnect().await;
                victim
            }
        };
        procs.push(victim);
        procs.push(spawn(procs.len()));
    }
    assert_eq!(restarts, plan.restarts, "every planned restart happened");
    assert_eq!(pauses, plan.pauses, "every planned pause happened");
    let kills = procs.iter().filter(|p| p.killed.is_some()).count();

    // The last keyturnd settles everything: leases lapse, the sweep runs,
    // retries come due.
    let ids: Vec<Uuid> = approved.iter().map(|a| a.id).collect();
    let settled = settle(&w, &ids).await;
    let last = procs.pop().expect("the last keyturnd");
    let last_worker = last.worker.clone();
    let last_log = last.keyturnd.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // What the database holds.
    let facts = Facts::read(&w, &ids).await;
    let mut logs: HashMap<String, String> = procs
        .iter()
        .map(|p| (p.worker.clone(), p.keyturnd.log()))
        .collect();
    logs.insert(last_worker.clone(), last_log);
    let killed: HashMap<&str, (Instant, bool)> = procs
        .iter()
        .filter_map(|p| Some((p.worker.as_str(), (p.killed?, p.in_restart))))
        .collect();

    // What the receivers saw, per action.
    let mut requests: HashMap<Uuid, usize> = HashMap::new();
    for r in rx.all() {
        if let Some(id) = r.action_id {
            *requests.entry(id).or_default() += 1;
        }
    }
    let by_key: HashMap<&str, Uuid> = approved.iter().map(|a| (a.key.as_str(), a.id)).collect();
    // And when they answered: (answers, the last one).
    let mut answers: HashMap<Uuid, (usize, Instant)> = HashMap::new();
    let mut answered = |id: Uuid, at: Instant| {
        let e = answers.entry(id).or_insert((0, at));
        e.0 += 1;
        e.1 = e.1.max(at);
    };
    for (id, at) in rx.answered() {
        if let Some(id) = id {
            answered(id, at);
        }
    }
    let delivered = smtp.delivered();
    let mut smtp_requests = 0;
    let mut smtp_ids: Vec<Option<Uuid>> = Vec::with_capacity(delivered.len());
    for d in &delivered {
        smtp_requests += 1;
        let id = message_key(&d.data).and_then(|k| by_key.get(k.as_str()).copied());
        if let Some(id) = id {
            *requests.entry(id).or_default() += 1;
        }
        smtp_ids.push(id);
    }
    for (index, at) in smtp.answered() {
        if let Some(Some(id)) = smtp_ids.get(index) {
            answered(*id, at);
        }
    }
    let webhook_requests = rx.all().len();

    let mut violations: Vec<String> = Vec::new();
    let mut per_status: std::collections::BTreeMap<String, usize> = Default::default();
    let (mut resent_after_retry, mut duplicates) = (0, 0);
    // [plain kills, kills during a restart]
    let (mut in_flight, mut never_sent, mut answered_first) = ([0; 2], [0; 2], [0; 2]);
    let mut given_up = 0;
    let (mut uncertain_seen, mut uncertain_unseen) = (0, 0);
    for a in &approved {
        let Some(f) = facts.actions.get(&a.id) else {
            violations.push(format!("{}: no action row", a.id));
            continue;
        };
        *per_status.entry(f.status.clone()).or_default() += 1;
        let attempts = facts.attempts.get(&a.id).cloned().unwrap_or_default();
        let seen = requests.get(&a.id).copied().unwrap_or(0);
        let retries = attempts
            .iter()
            .filter(|t| t.outcome.as_deref() == Some("retry"))
            .count();

        match f.status.as_str() {
            "succeeded" | "failed" | "uncertain" => {}
            "queued" if !f.due => {}
            other => violations.push(format!(
                "{} ({:?}): ended {other} (due: {}) after the settle wait",
                a.id, a.kind, f.due
            )),
        }
        if seen > 1 + retries {
            duplicates += seen - 1 - retries;
            violations.push(format!(
                "{} ({:?}): {seen} provider requests for one idempotency key, with {retries} retry outcome(s) to allow re-sends",
                a.id, a.kind
            ));
        } else if seen > 1 {
            resent_after_retry += seen - 1;
        }
        if attempts.len() != usize::try_from(f.attempts).unwrap_or(0) {
            violations.push(format!(
                "{}: attempts = {} but {} attempt rows",
                a.id,
                f.attempts,
                attempts.len()
            ));
        }
        for t in &attempts {
            if t.outcome.is_none() {
                violations.push(format!(
                    "{}: attempt {} by {} never finished",
                    a.id, t.attempt, t.worker
                ));
            }
        }
        if f.status == "uncertain" {
            if seen > 0 {
                uncertain_seen += 1;
            } else {
                uncertain_unseen += 1;
            }
            match attempts.last() {
                Some(t) if killed.contains_key(t.worker.as_str()) => {
                    let (killed_at, in_restart) = killed[t.worker.as_str()];
                    let k = usize::from(in_restart);
                    match answers.get(&a.id) {
                        // Its last request was answered before the kill: an
                        // outcome the provider gave that never reached the
                        // database (or keyturnd had not read it yet).
                        Some((n, last)) if *n == seen && *last < killed_at => {
                            answered_first[k] += 1
                        }
                        _ if seen == 0 => never_sent[k] += 1,
                        _ => in_flight[k] += 1,
                    }
                }
                Some(t)
                    if logs.get(&t.worker).is_some_and(|log| {
                        log.lines().any(|l| {
                            l.contains("COULD NOT RECORD") && l.contains(&a.id.to_string())
                        })
                    }) =>
                {
                    given_up += 1;
                }
                Some(t) => violations.push(format!(
                    "{} ({:?}): uncertain, but its attempt {} was begun by {}, which was never killed and never said it gave up recording it",
                    a.id, a.kind, t.attempt, t.worker
                )),
                None => violations.push(format!("{}: uncertain without an attempt", a.id)),
            }
        }
        let usage = facts.usage.get(&a.id).copied().unwrap_or(0);
        let want_usage = i64::from(f.status == "succeeded");
        if usage != want_usage {
            violations.push(format!("{}: {} with {usage} usage row(s)", a.id, f.status));
        }
        let events = facts.events.get(&a.id).cloned().unwrap_or_default();
        if let Some(problem) = chain_problem(&events, &f.status, attempts.len()) {
            violations.push(format!("{}: events: {problem}", a.id));
        }
    }

    // The tenant's audit chain holds through every kill and restart: each
    // commit wrote its events whole or not at all.
    let op = e2e::connect(w.port, "app_operator").await;
    let chain = op
        .query_one(
            "SELECT ok, events, first_bad FROM keyturn.verify_audit($1)",
            &[&w.tenant],
        )
        .await
        .expect("verify_audit");
    if !chain.get::<_, bool>(0) {
        violations.push(format!(
            "the audit chain does not verify: {} events verified, first bad event {:?}",
            chain.get::<_, i64>(1),
            chain.get::<_, Option<i64>>(2)
        ));
    }

    let count = |needle: &str| -> usize {
        logs.values()
            .map(|l| l.lines().filter(|x| x.contains(needle)).count())
            .sum()
    };
    let replayed = count("journaled outcome recorded");
    // A refused replay is noise when the outcome's attempt got an outcome
    // after all (recorded, the acknowledgement lost with the process) or
    // never existed (a `retry` for a begin whose COMMIT was lost), and a
    // loss when that very attempt ended lapsed (uncertain).
    let (mut refused_recorded, mut refused_lost) = (0, 0);
    let field = |line: &str, name: &str| -> Option<Uuid> {
        line.split(&format!("{name}="))
            .nth(1)?
            .get(..36)?
            .parse()
            .ok()
    };
    for line in logs
        .values()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains("journaled outcome refused"))
    {
        let (id, lease) = (field(line, "action_id"), field(line, "lease_id"));
        let lapsed = id
            .and_then(|id| facts.attempts.get(&id))
            .and_then(|ts| ts.iter().find(|t| Some(t.lease_id) == lease))
            .is_some_and(|t| t.outcome.as_deref() == Some("lapsed"));
        // Possible only when a sweep came first (the documented path: the
        // operator is told), so counted, not failed.
        if lapsed {
            refused_lost += 1;
        } else {
            refused_recorded += 1;
        }
    }
    let statuses = per_status
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let report = format!(
        "soak ({mode}, journal {journal}): {actions} actions ({statuses}); \
         requests {requests} (webhook {webhook_requests}, smtp {smtp_requests}); \
         re-sent after a retry outcome {resent_after_retry}; duplicates {duplicates}; \
         uncertain with a request seen {uncertain_seen}, without {uncertain_unseen}; \
         after a plain kill: in flight (request seen, not answered before the kill) {if0}, \
         answered before the kill {af0}, never sent {ns0}; \
         after a kill during a postgres restart: in flight {if1}, answered before the kill {af1}, \
         never sent {ns1}; given up recording (logged) {given_up}; \
         kills {kills} ({pauses} after a SIGSTOP past the lease), postgres restarts {restarts}; \
         journaled outcomes replayed {replayed}, refused {refused} \
         (already recorded or never begun {refused_recorded}, lost {refused_lost}); \
         settled {settled}; violations {violations}",
        refused = refused_recorded + refused_lost,
        if0 = in_flight[0],
        af0 = answered_first[0],
        ns0 = never_sent[0],
        if1 = in_flight[1],
        af1 = answered_first[1],
        ns1 = never_sent[1],
        journal = if journal_on { "on" } else { "off" },
        actions = approved.len(),
        requests = webhook_requests + smtp_requests,
        settled = if settled { "yes" } else { "no" },
        violations = violations.len(),
    );
    say(&format!("\n*** {report} ***\n"));
    if let Ok(path) = std::env::var("KT_SOAK_REPORT") {
        let _ = std::fs::write(path, format!("{report}\n"));
    }
    for v in violations.iter().take(50) {
        say(&format!("VIOLATION {v}"));
    }
    assert!(
        violations.is_empty(),
        "{} invariant violation(s); the first are listed above",
        violations.len()
    );
    assert!(kills >= plan.kills, "{kills} kills of {}", plan.kills);
}

/// The idempotency key in a message's `Message-ID: <key@keyturn>`.
fn message_key(data: &str) -> Option<String> {
    data.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("message-id:"))
        .and_then(|l| {
            let v = l.split_once(':')?.1.trim();
            let v = v.strip_prefix('<')?.strip_suffix('>')?;
            Some(v.strip_suffix("@keyturn")?.to_owned())
        })
}

/// Waits until no action is leased or executing and none is queued and
/// due; `false` if that did not happen within [`SETTLE_WITHIN`] (the checks
/// then say which).
async fn settle(w: &World, ids: &[Uuid]) -> bool {
    let start = std::time::Instant::now();
    loop {
        let open: i64 = w
            .superuser
            .query_one(
                "SELECT count(*) FROM keyturn.action WHERE id = ANY($1) \
                   AND (status IN ('leased', 'executing') \
                        OR (status = 'queued' AND next_attempt_at <= now() + interval '5 seconds'))",
                &[&ids],
            )
            .await
            .expect("open actions")
            .get(0);
        if open == 0 {
            return true;
        }
        if start.elapsed() > SETTLE_WITHIN {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[derive(Clone, Debug)]
struct ActionFacts {
    status: String,
    attempts: i32,
    /// Queued and due (or past due).
    due: bool,
}

#[derive(Clone, Debug)]
struct AttemptFacts {
    attempt: i32,
    lease_id: Uuid,
    worker: String,
    outcome: Option<String>,
}

struct Facts {
    actions: HashMap<Uuid, ActionFacts>,
    attempts: HashMap<Uuid, Vec<AttemptFacts>>,
    usage: HashMap<Uuid, i64>,
    events: HashMap<Uuid, Vec<(Option<String>, String)>>,
}

impl Facts {
    async fn read(w: &World, ids: &[Uuid]) -> Facts {
        let db = &w.superuser;
        let mut actions = HashMap::new();
        for r in db
            .query(
                "SELECT id, status::text, attempts, coalesce(next_attempt_at <= now(), false) \
                   FROM keyturn.action WHERE id = ANY($1)",
                &[&ids],
            )
            .await
            .expect("actions")
        {
            actions.insert(
                r.get(0),
                ActionFacts {
                    status: r.get(1),
                    attempts: r.get(2),
                    due: r.get(3),
                },
            );
        }
        let mut attempts: HashMap<Uuid, Vec<AttemptFacts>> = HashMap::new();
        for r in db
            .query(
                "SELECT action_id, attempt, coalesce(worker, ''), outcome::text, lease_id FROM keyturn.attempt \
                  WHERE action_id = ANY($1) ORDER BY action_id, attempt",
                &[&ids],
            )
            .await
            .expect("attempts")
        {
            attempts.entry(r.get(0)).or_default().push(AttemptFacts {
                attempt: r.get(1),
                worker: r.get(2),
                outcome: r.get(3),
                lease_id: r.get(4),
            });
        }
        let mut usage = HashMap::new();
        for r in db
            .query(
                "SELECT action_id, count(*) FROM keyturn.usage WHERE action_id = ANY($1) GROUP BY 1",
                &[&ids],
            )
            .await
            .expect("usage")
        {
            usage.insert(r.get(0), r.get(1));
        }
        let mut events: HashMap<Uuid, Vec<(Option<String>, String)>> = HashMap::new();
        for r in db
            .query(
                "SELECT action_id, from_status::text, to_status::text FROM keyturn.event \
                  WHERE action_id = ANY($1) ORDER BY action_id, id",
                &[&ids],
            )
            .await
            .expect("events")
        {
            events
                .entry(r.get(0))
                .or_default()
                .push((r.get(1), r.get(2)));
        }
        Facts {
            actions,
            attempts,
            usage,
            events,
        }
    }
}

/// Whether an action's events are one chain from its creation to `status`,
/// one per status change, with one `executing` per attempt.
fn chain_problem(
    events: &[(Option<String>, String)],
    status: &str,
    attempts: usize,
) -> Option<String> {
    let Some((first_from, first_to)) = events.first() else {
        return Some("none".into());
    };
    if first_from.is_some() || first_to != "pending" {
        return Some(format!("starts {first_from:?} -> {first_to}"));
    }
    for pair in events.windows(2) {
        let (prev_to, (from, to)) = (&pair[0].1, &pair[1]);
        if from.as_deref() != Some(prev_to.as_str()) {
            return Some(format!("{prev_to} is followed by {from:?} -> {to}"));
        }
        if from.as_deref() == Some(to.as_str()) {
            return Some(format!("a change from {to} to itself"));
        }
    }
    let last = &events[events.len() - 1].1;
    if last != status {
        return Some(format!("end at {last}, the action is {status}"));
    }
    let executing = events.iter().filter(|(_, to)| to == "executing").count();
    if executing != attempts {
        return Some(format!(
            "{executing} to executing for {attempts} attempt(s)"
        ));
    }
    None
}

#[test]
fn test_chain_problem_finds_gaps_repeats_and_wrong_ends() {
    let e = |from: Option<&str>, to: &str| (from.map(str::to_owned), to.to_owned());
    let good = vec![
        e(None, "pending"),
        e(Some("pending"), "queued"),
        e(Some("queued"), "leased"),
        e(Some("leased"), "executing"),
        e(Some("executing"), "succeeded"),
    ];
    assert_eq!(chain_problem(&good, "succeeded", 1), None);
    assert!(chain_problem(&good, "failed", 1).is_some(), "wrong end");
    assert!(chain_problem(&good, "succeeded", 2).is_some(), "attempts");
    let mut gap = good.clone();
    gap.remove(2);
    assert!(
        chain_problem(&gap, "succeeded", 1).is_some(),
        "a missing event"
    );
    let mut twice = good.clone();
    twice.insert(4, e(Some("executing"), "executing"));
    assert!(chain_problem(&twice, "succeeded", 1).is_some(), "a repeat");
    assert!(chain_problem(&[], "pending", 0).is_some());
    assert_eq!(
        message_key("Subject: x\r\nMessage-ID: <ik-abc@keyturn>\r\n").as_deref(),
        Some("ik-abc")
    );
}
