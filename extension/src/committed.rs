//! Admission decisions on committed data, under every isolation level.
//!
//! Under READ COMMITTED each statement sees what is committed when it starts.
//! Under REPEATABLE READ a transaction sees its first snapshot to the end: an
//! agent that takes a snapshot, waits, and then proposes would be judged on
//! the state before a person archived the conversation, recorded a newer
//! turn, or before other proposals filled a rate window. The reads that admit
//! (or refuse) a proposal therefore look at the latest committed state, as
//! PostgreSQL's own foreign-key checks do (`SPI_execute_snapshot` with
//! `GetLatestSnapshot()`); rows locked on the way (grants, delegations,
//! requests) fail to serialize (40001) by themselves.
//!
//! And the tool and authorization an approval was decided on are read again
//! when the transaction commits ([`recheck_at_commit`]): the decision reads
//! them without a row lock, so an agent that leaves a transaction open with
//! a covered write in it cannot stall `set_tool_enabled` or `register_tool`
//! (nor another approval); instead that transaction cannot commit once the
//! tool is off (40001).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

use pgrx::prelude::*;

use crate::error::KeyturnError;
use crate::privilege::{self, RoleSwitch};

/// One statement's plan, kept for the backend's life (SPI_keepplan).
struct Kept(pg_sys::SPIPlanPtr);

thread_local! {
    static PLANS: RefCell<HashMap<&'static str, Kept>> = RefCell::new(HashMap::new());
    /// What approval decisions in this transaction read: (nest level, tool,
    /// version, tenant, principal, epoch).
    static NOTED: RefCell<Vec<Noted>> = const { RefCell::new(Vec::new()) };
    /// Terms that end without a change to what NOTED reads, which decisions
    /// in this transaction rested on.
    static ENDS: RefCell<Vec<Ends>> = const { RefCell::new(Vec::new()) };
}

/// A decision's term that ends without moving a tool's version or an epoch,
/// so the commit looks at it again itself.
struct Ends {
    level: i32,
    term: Term,
    /// How it ended, in the commit error's words.
    what: String,
}

enum Term {
    /// At a time: a grant's `valid_until`, a standing approval's end, a
    /// proposal's expiry. The commit compares the clock with it.
    At(pg_sys::TimestampTz),
    /// While `turn` is the conversation's latest (a task request's
    /// admission): the commit reads the latest turn as committed, as the
    /// role the admission ran as.
    LatestTurn {
        owner: pg_sys::Oid,
        tenant: String,
        principal: String,
        conversation: String,
        turn: String,
    },
}

impl Ends {
    fn ended(&self, now: pg_sys::TimestampTz) -> bool {
        match &self.term {
            Term::At(at) => *at <= now,
            Term::LatestTurn {
                owner,
                tenant,
                principal,
                conversation,
                turn,
            } => {
                let _as_owner = RoleSwitch::to(*owner);
                let local = crate::citus::begin_local("keyturn.request", tenant);
                let latest = latest_turn(tenant, principal, conversation);
                crate::citus::end_local(local);
                latest.as_deref() != Some(turn.as_str())
            }
        }
    }
}

fn note_term(term: Term, what: String) -> String {
    // SAFETY: a plain read of the backend's transaction state.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    ENDS.with(|ends| ends.borrow_mut().push(Ends { level, term, what }));
    String::new()
}

struct Noted {
    level: i32,
    /// The role the decision ran as (the extension owner): the commit runs
    /// its check as that role, whoever the session is.
    owner: pg_sys::Oid,
    /// None: only the principal's authorization was decided on (the
    /// approver's own, `_recheck_epoch_at_commit`).
    tool: Option<String>,
    version: i32,
    tenant: String,
    principal: String,
    epoch: i64,
    /// The conversation the approved proposal belongs to, and the evidence
    /// it cites: a person who cancels the one, or revokes the other, while
    /// the approving transaction is still open stops it at its commit
    /// (twelfth red-team pass, docs/security.md row 104).
    conversation: Option<String>,
    evidence: Vec<String>,
}

/// Runs `sql` (one text result column, at most one row) on the latest
/// committed snapshot, whatever the transaction's isolation level.
fn latest_text(
    sql: &'static str,
    args: &[Option<String>],
    types: &[pg_sys::Oid],
) -> Option<String> {
    on_latest(sql, args, types, true)
}

/// Runs `sql` on the latest committed snapshot (and this transaction's own
/// changes), reading or (`read_only` false) writing, and returns the first
/// column of its first row as text. What it writes it finds by that
/// snapshot too, so under REPEATABLE READ a row another transaction updated
/// since this one began is updated in its newest version rather than
/// failing to serialize: for writers that hold a lock of keyturn's own that
/// makes them the row's only writer (crate::audit).
pub fn on_latest(
    sql: &'static str,
    args: &[Option<String>],
    types: &[pg_sys::Oid],
    read_only: bool,
) -> Option<String> {
    Spi::connect(|_| {
        // SAFETY: inside Spi::connect, so SPI is connected; the plan is kept
        // (SPI_keepplan) before it is stored; values are built from owned
        // strings that outlive the call; the tuple table is read before
        // Spi::connect ends (SPI_finish frees it).
        unsafe {
            let plan = PLANS.with(|plans| {
                let mut plans = plans.borrow_mut();
                if let Some(kept) = plans.get(sql) {
                    return kept.0;
                }
                let text = CString::new(sql).expect("no NUL in keyturn's own SQL");
                let mut oids = types.to_vec();
                let plan = pg_sys::SPI_prepare(
                    text.as_ptr(),
                    i32::try_from(oids.len()).unwrap_or(i32::MAX),
                    oids.as_mut_ptr(),
                );
                if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                    KeyturnError::NotReady(format!("could not plan {sql}")).raise();
                }
                plans.insert(sql, Kept(plan));
                plan
            });
            let mut values: Vec<pg_sys::Datum> = Vec::with_capacity(args.len());
            let mut nulls: Vec<std::ffi::c_char> = Vec::with_capacity(args.len());
            for arg in args {
                match arg {
                    Some(s) => {
                        values.push(s.as_str().into_datum().unwrap_or(pg_sys::Datum::from(0)));
                        nulls.push(b' ' as std::ffi::c_char);
                    }
                    None => {
                        values.push(pg_sys::Datum::from(0));
                        nulls.push(b'n' as std::ffi::c_char);
                    }
                }
            }
            let rc = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(),
                read_only,
                // A write fires its AFTER triggers (a DBA's on
                // keyturn.event, say) as any statement's: at the commit no
                // query of the caller's is open to queue them in.
                !read_only,
                1,
            );
            if rc < 0 {
                KeyturnError::NotReady(format!("a statement on committed state failed ({rc})"))
                    .raise();
            }
            if pg_sys::SPI_processed == 0 || pg_sys::SPI_tuptable.is_null() {
                return None;
            }
            let table = &*pg_sys::SPI_tuptable;
            let mut is_null = false;
            let datum = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut is_null);
            String::from_polymorphic_datum(datum, is_null, pg_sys::TEXTOID)
        }
    })
}

/// How the conversation ended for its principal ('cancelled', 'archived'),
/// as committed, or NULL while it is live.
#[pg_extern(name = "_ended_how", stable, parallel_unsafe)]
fn ended_how(tenant: &str, principal: &str, conversation: &str) -> Option<String> {
    latest_text(
        "SELECT c.how FROM keyturn.cancelled_origin c \
          WHERE c.tenant = $1 AND c.principal = $2 AND c.conversation_id = $3",
        &[
            Some(tenant.into()),
            Some(principal.into()),
            Some(conversation.into()),
        ],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
}

/// Whether evidence `id` (its canonical text) is this principal's, of this
/// tenant, and not revoked, as committed: a revocation that committed after
/// the caller's snapshot counts.
#[pg_extern(name = "_evidence_usable", stable, parallel_unsafe)]
fn evidence_usable(tenant: &str, principal: &str, id: &str) -> bool {
    latest_text(
        "SELECT 'y' FROM keyturn.evidence e \
          WHERE e.id = $3::uuid AND e.tenant = $1 AND e.principal = $2 AND e.revoked_at IS NULL",
        &[Some(tenant.into()), Some(principal.into()), Some(id.into())],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
    .is_some()
}

/// The first of `ids` (canonical texts) that was revoked, as committed.
#[pg_extern(name = "_evidence_revoked", stable, parallel_unsafe)]
fn evidence_revoked(tenant: &str, ids: Vec<String>) -> Option<String> {
    latest_text(
        "SELECT e.id::text FROM keyturn.evidence e \
          WHERE e.tenant = $1 AND e.revoked_at IS NOT NULL AND e.id::text = ANY ($2::text[]) LIMIT 1",
        &[Some(tenant.into()), Some(format!("{{{}}}", ids.join(",")))],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
}

/// The conversation's latest recorded turn, as committed.
#[pg_extern(name = "_latest_turn", stable, parallel_unsafe)]
fn latest_turn(tenant: &str, principal: &str, conversation: &str) -> Option<String> {
    latest_text(
        "SELECT x.turn_id FROM keyturn.request x \
          WHERE x.tenant = $1 AND x.principal = $2 AND x.conversation_id = $3 \
          ORDER BY x.seq DESC LIMIT 1",
        &[
            Some(tenant.into()),
            Some(principal.into()),
            Some(conversation.into()),
        ],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
}

/// Proposals of (tenant, principal, tool) in the last `per` (an interval's
/// text), as committed, and the caller's own earlier ones (the latest
/// snapshot sees this transaction's earlier commands).
#[pg_extern(name = "_recent_proposals", stable, parallel_unsafe)]
fn recent_proposals(tenant: &str, principal: &str, tool: &str, per: &str) -> i64 {
    latest_text(
        "SELECT count(*)::text FROM keyturn.action a \
          WHERE a.tenant = $1 AND a.principal = $2 AND a.tool = $3 \
            AND a.created_at > clock_timestamp() - $4::interval",
        &[
            Some(tenant.into()),
            Some(principal.into()),
            Some(tool.into()),
            Some(per.into()),
        ],
        &[
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
        ],
    )
    .and_then(|n| n.parse().ok())
    .unwrap_or(0)
}

/// When the live grant of (tenant, principal, tool) was given, as committed
/// (NULL without one): propose reads the grant without a lock (the row is
/// the admin's, keyturn.grant_use the proposer's), so under REPEATABLE READ
/// it compares what its snapshot saw with this, and a grant given, changed
/// or revoked since fails to serialize rather than admit on the old one.
#[pg_extern(name = "_committed_grant_at", stable, parallel_unsafe)]
fn committed_grant_at(tenant: &str, principal: &str, tool: &str) -> Option<String> {
    latest_text(
        "SELECT g.granted_at::text FROM keyturn.tool_grant g \
          WHERE g.tenant = $1 AND g.principal = $2 AND g.tool = $3 \
            AND keyturn._grant_live(g.valid_until)",
        &[
            Some(tenant.into()),
            Some(principal.into()),
            Some(tool.into()),
        ],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
}

/// "<files> <bytes>" a principal has staged and waiting, as committed (and
/// this transaction's own).
#[pg_extern(name = "_committed_staged", stable, parallel_unsafe)]
fn committed_staged(tenant: &str, principal: &str) -> String {
    latest_text(
        "SELECT count(*) || ' ' || coalesce(sum(s.size), 0) FROM keyturn.staged_file s \
          WHERE s.tenant = $1 AND s.principal = $2",
        &[Some(tenant.into()), Some(principal.into())],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    )
    .unwrap_or_else(|| "0 0".into())
}

/// Notes that an approval decision of this transaction read `tool` at
/// `version` and the principal's authorization at `epoch`; the commit
/// checks them again. Called by keyturn._invalid_reason when it passes.
/// Returns '' (assigned, not PERFORMed: no statement).
#[pg_extern(name = "_recheck_at_commit", volatile, parallel_unsafe)]
fn recheck_at_commit(
    tool: &str,
    version: i32,
    tenant: &str,
    principal: &str,
    epoch: i64,
    conversation: Option<&str>,
    evidence: Option<Vec<String>>,
) -> String {
    note(
        Some(tool),
        version,
        tenant,
        principal,
        epoch,
        conversation,
        evidence.unwrap_or_default(),
    )
}

/// Notes that a decision of this transaction was taken by `principal` (the
/// person approving, rejecting or revising, or a vote that counted) on
/// their authorization at `epoch`, as the transaction read it; the commit
/// checks it again on committed data, so that a member removed, demoted or
/// whose grant was revoked after a REPEATABLE READ snapshot decides nothing
/// (docs/security.md, row 82). Returns ''.
#[pg_extern(name = "_recheck_epoch_at_commit", volatile, parallel_unsafe)]
fn recheck_epoch_at_commit(tenant: &str, principal: &str, epoch: i64) -> String {
    if uses_transaction_snapshot() && committed_epoch(tenant, principal) != epoch {
        stale_snapshot(&format!("the authorization of principal {principal}"));
    }
    note(None, 0, tenant, principal, epoch, None, Vec::new())
}

/// Notes that a decision of this transaction holds only until `at`: a
/// grant's `valid_until`, a standing approval's end. An agent that leaves a
/// covered write open in its transaction past it cannot commit it (40001),
/// as after a revocation (thirteenth red-team pass, docs/security.md row
/// 105). Returns '' (assigned, not PERFORMed: no statement).
#[pg_extern(name = "_ends_at_commit", volatile, parallel_unsafe)]
fn ends_at_commit(at: TimestampWithTimeZone, what: &str) -> String {
    note_term(Term::At(at.into_inner()), format!("{what} ended"))
}

/// Notes that what a task request admitted in this transaction holds only
/// while `turn` is its conversation's latest: a person who says something
/// new ("no, stop") while the agent holds the write open stops it at its
/// commit (40001; fourteenth red-team pass, docs/security.md row 108).
/// Returns '' (assigned: no statement).
#[pg_extern(name = "_turn_at_commit", volatile, parallel_unsafe)]
fn turn_at_commit(tenant: &str, principal: &str, conversation: &str, turn: &str) -> String {
    note_term(
        Term::LatestTurn {
            owner: privilege::current_user(),
            tenant: tenant.into(),
            principal: principal.into(),
            conversation: conversation.into(),
            turn: turn.into(),
        },
        format!("a turn of conversation {conversation} after {turn} was recorded"),
    )
}

/// Under REPEATABLE READ or SERIALIZABLE: raises 40001 unless the tool row
/// (`enabled`, `version`; both NULL: no row) and the principal's `epoch`
/// that an approval decision just read on the transaction's snapshot are
/// still what is committed. keyturn._invalid_reason asks it before it
/// decides, so a decision never rests on a tool or an authorization that
/// changed after the snapshot: without it, an approval decided after a kill
/// switch had returned ran its business write, triggers and all, before its
/// commit failed (eleventh red-team pass, F2), and a tool off in the
/// snapshot but on again ended the proposal `invalidated` for a reason no
/// longer true (F4). Under READ COMMITTED each statement reads what is
/// committed, and this reads nothing. Returns '' (assigned: no statement).
#[pg_extern(name = "_read_as_committed", volatile, parallel_unsafe)]
fn read_as_committed(
    tool: &str,
    enabled: Option<bool>,
    version: Option<i32>,
    tenant: &str,
    principal: &str,
    epoch: i64,
) -> String {
    if uses_transaction_snapshot() {
        let (state, now_epoch) = committed_state(Some(tool), tenant, principal);
        if state != enabled.map(|on| (on, version)) || now_epoch != epoch {
            stale_snapshot(&format!(
                "tool {tool} or the authorization of principal {principal}"
            ));
        }
    }
    String::new()
}

/// REPEATABLE READ and SERIALIZABLE: the transaction reads one snapshot.
fn uses_transaction_snapshot() -> bool {
    // SAFETY: a plain read of the backend's isolation level.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

fn committed_epoch(tenant: &str, principal: &str) -> i64 {
    committed_state(None, tenant, principal).1
}

fn stale_snapshot(what: &str) -> ! {
    KeyturnError::Busy(format!(
        "{what} changed after this transaction's snapshot was taken; nothing was decided \
         (the same call in a new transaction answers with the current state)"
    ))
    .raise()
}

fn note(
    tool: Option<&str>,
    version: i32,
    tenant: &str,
    principal: &str,
    epoch: i64,
    conversation: Option<&str>,
    evidence: Vec<String>,
) -> String {
    // SAFETY: a plain read of the backend's transaction state.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    NOTED.with(|noted| {
        noted.borrow_mut().push(Noted {
            level,
            owner: privilege::current_user(),
            tool: tool.map(str::to_owned),
            version,
            tenant: tenant.into(),
            principal: principal.into(),
            epoch,
            conversation: conversation.map(str::to_owned),
            evidence,
        })
    });
    String::new()
}

/// At PRE_COMMIT, before anything of the commit's recheck is read, and before
/// its tenants' chains: the locks that order it against a change to what it
/// reads (crate::recheck_locks).
pub fn hold_noted() {
    let decisions: Vec<(Option<String>, String, String)> = NOTED.with(|noted| {
        noted
            .borrow()
            .iter()
            .map(|n| (n.tool.clone(), n.tenant.clone(), n.principal.clone()))
            .collect()
    });
    if decisions.is_empty() {
        return;
    }
    // The database's key (keyturn_secret) is the owner's to read.
    let _as_owner = RoleSwitch::to(privilege::extension_owner());
    // On a Citus worker, at the commit of a delegated call, reading the key
    // is a statement Citus refuses unless allowed, as for the chain
    // (citus::begin_local); where it cannot be allowed there is no lock to
    // take that a kill switch on another node would see (docs/scale-out.md).
    let local = crate::citus::begin_local("keyturn.auth_epoch", &decisions[0].1);
    if local.is_none() && crate::citus::internal_backend() && crate::citus::active() {
        return;
    }
    crate::recheck_locks::hold(
        decisions.iter().map(|(tool, tenant, principal)| {
            (tool.as_deref(), tenant.as_str(), principal.as_str())
        }),
    );
    crate::citus::end_local(local);
}

/// At PRE_COMMIT, once the audit chain is held (crate::xact): each noted
/// decision against the latest committed tool row and epoch; the first
/// that no longer holds fails the commit with 40001.
pub fn check_noted() {
    let ends = ENDS.with(|ends| std::mem::take(&mut *ends.borrow_mut()));
    // SAFETY: reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    if let Some(ended) = ends.iter().find(|e| e.ended(now)) {
        KeyturnError::Busy(format!(
            "{} while this transaction was open; what it approved does not commit",
            ended.what
        ))
        .raise();
    }
    let noted = NOTED.with(|noted| std::mem::take(&mut *noted.borrow_mut()));
    // A tool's check reads the principal's epoch too: an authorization
    // noted alone that one of them covers (a person approving their own
    // agent's proposal) is not read again.
    let covered: std::collections::HashSet<(&str, &str, i64)> = noted
        .iter()
        .filter(|n| n.tool.is_some())
        .map(|n| (n.tenant.as_str(), n.principal.as_str(), n.epoch))
        .collect();
    let mut seen = std::collections::HashSet::new();
    for n in &noted {
        let (tenant, principal) = (n.tenant.as_str(), n.principal.as_str());
        if let Some(problem) = origin_problem(n) {
            KeyturnError::Busy(format!(
                "{problem} while this transaction was open; what it approved does not commit"
            ))
            .raise();
        }
        if n.tool.is_none() && covered.contains(&(tenant, principal, n.epoch)) {
            continue;
        }
        if !seen.insert((n.tool.as_deref(), n.version, tenant, principal, n.epoch)) {
            continue;
        }
        let _as_owner = RoleSwitch::to(n.owner);
        let problem = commit_problem(n.tool.as_deref(), n.version, tenant, principal, n.epoch);
        if let Some(problem) = problem {
            KeyturnError::Busy(format!(
                "{problem} while this transaction was open; what it approved does not commit \
                 (the same call again answers with the current state)"
            ))
            .raise();
        }
    }
}

/// The tool's switch and version and the principal's epoch, as committed
/// now, in one statement: no row, no tool.
const TOOL_AND_EPOCH: &str = "SELECT t.enabled::text || ' ' || t.version || ' ' || \
       coalesce((SELECT e.epoch FROM keyturn.auth_epoch e WHERE e.tenant = $2 AND e.principal = $3), 0) \
  FROM keyturn.tool t WHERE t.name = $1";
/// The principal's epoch alone (0 until it first changes).
const EPOCH: &str = "SELECT coalesce((SELECT e.epoch FROM keyturn.auth_epoch e \
                                       WHERE e.tenant = $1 AND e.principal = $2), 0)::text";

thread_local! {
    /// TOOL_AND_EPOCH's tool half over a Citus worker's local placement of
    /// keyturn.tool, by placement: one statement per placement name, kept
    /// for the backend (a worker has one or two).
    static ON_PLACEMENT: RefCell<HashMap<String, &'static str>> = RefCell::new(HashMap::new());
}

/// A tool row as committed: (enabled, version); None: no such tool.
type ToolState = Option<(bool, Option<i32>)>;

/// The tool's row (when `tool` is given) and the principal's epoch, as
/// committed now. On a Citus worker at the commit of a delegated call the
/// tool is read from its local placement (a reference table's shard),
/// which Citus lets a delegated call read; keyturn.auth_epoch is
/// distributed by tenant in layout B, and there Citus refuses its read
/// unless allowed, for this tenant's local shard only (citus.rs; without
/// Citus nothing is asked).
fn committed_state(tool: Option<&str>, tenant: &str, principal: &str) -> (ToolState, i64) {
    let local = crate::citus::begin_local("keyturn.auth_epoch", tenant);
    let state = read_committed_state(tool, tenant, principal);
    crate::citus::end_local(local);
    state
}

fn read_committed_state(tool: Option<&str>, tenant: &str, principal: &str) -> (ToolState, i64) {
    let text = pg_sys::TEXTOID;
    let (who, whose) = (Some(tenant.to_owned()), Some(principal.to_owned()));
    let read_epoch = || {
        latest_text(EPOCH, &[who.clone(), whose.clone()], &[text, text])
            .and_then(|e| e.parse::<i64>().ok())
            .unwrap_or(0)
    };
    // "enabled version [epoch]": the tool row's text.
    let fields = |row: &str| {
        let mut f = row.split(' ');
        let enabled = f.next() == Some("true");
        let version = f.next().and_then(|v| v.parse::<i32>().ok());
        (
            enabled,
            version,
            f.next().and_then(|e| e.parse::<i64>().ok()),
        )
    };
    let (state, now_epoch) = match tool {
        None => (None, read_epoch()),
        Some(name) => {
            let placement = if crate::citus::active() {
                latest_text(
                    "SELECT keyturn._local_placement('keyturn.tool')::text",
                    &[],
                    &[],
                )
            } else {
                None
            };
            match placement {
                None => {
                    let row = latest_text(
                        TOOL_AND_EPOCH,
                        &[Some(name.to_owned()), who.clone(), whose.clone()],
                        &[text, text, text],
                    )
                    .map(|r| fields(&r));
                    // No tool row, no epoch read with it: read it alone.
                    let now = match row {
                        Some((_, _, e)) => e.unwrap_or(0),
                        None => read_epoch(),
                    };
                    (row.map(|(on, v, _)| (on, v)), now)
                }
                Some(placement) => {
                    let sql = ON_PLACEMENT.with(|kept| {
                        *kept.borrow_mut().entry(placement.clone()).or_insert_with(|| {
                            Box::leak(
                                format!(
                                    "SELECT t.enabled::text || ' ' || t.version FROM {placement} t WHERE t.name = $1"
                                )
                                .into_boxed_str(),
                            )
                        })
                    });
                    let row = latest_text(sql, &[Some(name.to_owned())], &[text]);
                    (
                        row.map(|r| fields(&r)).map(|(on, v, _)| (on, v)),
                        read_epoch(),
                    )
                }
            }
        }
    };
    (state, now_epoch)
}

/// What changed since an approval was decided on (tool, version, epoch), in
/// the words of the error the commit raises, or None. The rule, in one place:
/// the tool still enabled at the version approved, the principal's epoch
/// unchanged.
fn commit_problem(
    tool: Option<&str>,
    version: i32,
    tenant: &str,
    principal: &str,
    epoch: i64,
) -> Option<String> {
    let (state, now_epoch) = committed_state(tool, tenant, principal);
    if let Some(name) = tool {
        match state {
            Some((true, Some(v))) if v != version => {
                return Some(format!("tool {name} changed from version {version} to {v}"))
            }
            Some((true, _)) => {}
            _ => return Some(format!("tool {name} was disabled")), // off, or no row
        }
    }
    (now_epoch != epoch).then(|| format!("the authorization of principal {principal} changed"))
}

/// Whether the conversation of a noted approval was cancelled, or evidence
/// it cites revoked, as committed now (two of the reads
/// keyturn._invalid_reason made when it decided), in the commit error's
/// words. An archived conversation is not: archiving ends a conversation
/// normally and cancels only what has not run yet, and what this
/// transaction approved has. On a Citus worker at the commit of a delegated
/// call both tables are read on the tenant's local shard, as the epoch is
/// (committed_state).
fn origin_problem(n: &Noted) -> Option<String> {
    if n.conversation.is_none() && n.evidence.is_empty() {
        return None;
    }
    let _as_owner = RoleSwitch::to(n.owner);
    let local = crate::citus::begin_local("keyturn.cancelled_origin", &n.tenant);
    let cancelled = n
        .conversation
        .as_deref()
        .filter(|c| ended_how(&n.tenant, &n.principal, c).as_deref() == Some("cancelled"))
        .map(|c| format!("conversation {c} was cancelled"));
    let problem = cancelled.or_else(|| {
        (!n.evidence.is_empty())
            .then(|| evidence_revoked(&n.tenant, n.evidence.clone()))
            .flatten()
            .map(|id| format!("the evidence it cites ({id}) was revoked"))
    });
    crate::citus::end_local(local);
    problem
}

/// A subtransaction at `level` committed (RELEASE, or a plpgsql block
/// that ended without an error): what it noted now belongs to its parent,
/// so a later sibling at the same depth that rolls back leaves it be.
pub fn keep_in_parent(level: i32) {
    NOTED.with(|s| {
        for x in s.borrow_mut().iter_mut().filter(|x| x.level >= level) {
            x.level = level - 1;
        }
    });
    ENDS.with(|s| {
        for x in s.borrow_mut().iter_mut().filter(|x| x.level >= level) {
            x.level = level - 1;
        }
    });
}

/// Forgets what an aborted subtransaction noted (an approve_many element
/// that rolled back decided nothing).
pub fn forget_from_level(level: i32) {
    NOTED.with(|noted| noted.borrow_mut().retain(|n| n.level < level));
    ENDS.with(|ends| ends.borrow_mut().retain(|e| e.level < level));
}

/// Whether this transaction made decisions its commit checks again.
pub fn has_noted() -> bool {
    NOTED.with(|noted| !noted.borrow().is_empty()) || ENDS.with(|ends| !ends.borrow().is_empty())
}

/// Forgets everything at the end of the transaction.
pub fn forget_all() {
    NOTED.with(|noted| noted.borrow_mut().clear());
    ENDS.with(|ends| ends.borrow_mut().clear());
}
