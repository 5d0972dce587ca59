//! Who is acting, for the audit log: backend state, never a setting.
//!
//! Every keyturn function that changes an action notes the calling role, the
//! acting principal and the detail of the next event here first thing; the
//! lifecycle trigger reads them into the event row. 0.1.0 kept them in
//! settings (`keyturn.actor_role`, …), which any caller can set: a role with
//! write access to keyturn's tables set them and wrote an event naming a
//! person who never acted. Here only keyturn's own functions (EXECUTE on
//! `_set_actor` belongs to the extension owner alone) can set them, and they
//! are forgotten at the end of every transaction; a status change made by
//! anything else is logged as the session's own role, marked as a direct
//! write.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::prelude::*;

use crate::jsonb_text::JsonbText;

#[derive(Default)]
struct Actor {
    role: Option<String>,
    principal: Option<String>,
    detail: Option<String>,
    /// Details for the next event of particular actions, taken before
    /// `detail`: a batch changes many actions in one statement, each with
    /// its own detail (its attempt, its outcome). Each is used once.
    details: HashMap<[u8; 16], String>,
    /// Merged into every event detail while it lasts: what a whole call is
    /// part of (a batch, a standing approval, a task request, a quorum), each
    /// with the subtransaction level that set it. The call that sets one
    /// takes it off again (`_set_event_context(NULL)`), and a subtransaction
    /// that aborts takes off what it set: one that lingered named a standing
    /// approval or a quorum on later events it had nothing to do with
    /// (sixteenth red-team pass, docs/security.md row 114).
    context: Vec<(i32, serde_json::Map<String, serde_json::Value>)>,
}

thread_local! {
    static ACTOR: RefCell<Option<Actor>> = const { RefCell::new(None) };
}

/// Forgets the actor: called at the end of every transaction.
pub fn clear() {
    let _ = ACTOR.try_with(|a| a.borrow_mut().take());
}

/// Notes the acting role and principal for this transaction and clears the
/// event detail. Returns '' (callers `PERFORM` it).
#[pg_extern(name = "_set_actor", volatile, parallel_unsafe)]
fn set_actor(p_role: Option<&str>, p_principal: Option<&str>) -> String {
    ACTOR.with(|a| {
        let mut a = a.borrow_mut();
        let context = a
            .as_mut()
            .map(|a| std::mem::take(&mut a.context))
            .unwrap_or_default();
        *a = Some(Actor {
            role: p_role.filter(|r| !r.is_empty()).map(str::to_owned),
            principal: p_principal.filter(|p| !p.is_empty()).map(str::to_owned),
            detail: None,
            details: HashMap::new(),
            context,
        })
    });
    String::new()
}

/// Puts keys on the context merged into every later event detail, until
/// the same call takes them off with NULL (the last put on comes off).
/// Returns ''.
#[pg_extern(name = "_set_event_context", volatile, parallel_unsafe)]
fn set_event_context(p_context: Option<pgrx::JsonB>) -> String {
    // SAFETY: a plain read of the backend's transaction state.
    let level = unsafe { pgrx::pg_sys::GetCurrentTransactionNestLevel() };
    ACTOR.with(|a| {
        let mut a = a.borrow_mut();
        let actor = a.get_or_insert_with(Actor::default);
        match p_context.map(|c| c.0) {
            Some(serde_json::Value::Object(add)) => actor.context.push((level, add)),
            _ => {
                actor.context.pop();
            }
        }
    });
    String::new()
}

/// A subtransaction at `level` aborted: the contexts it put on come off.
pub fn forget_from_level(level: i32) {
    let _ = ACTOR.try_with(|a| {
        if let Some(a) = a.borrow_mut().as_mut() {
            a.context.retain(|(l, _)| *l < level);
        }
    });
}

/// A subtransaction at `level` committed: what it put on is its parent's.
pub fn keep_in_parent(level: i32) {
    let _ = ACTOR.try_with(|a| {
        if let Some(a) = a.borrow_mut().as_mut() {
            for (l, _) in a.context.iter_mut().filter(|(l, _)| *l >= level) {
                *l = level - 1;
            }
        }
    });
}

/// Sets the detail of the next event rows (never param values). Returns ''.
#[pg_extern(name = "_set_event_detail", volatile, parallel_unsafe)]
fn set_event_detail(p_detail: Option<JsonbText>) -> String {
    ACTOR
        .with(|a| a.borrow_mut().get_or_insert_with(Actor::default).detail = p_detail.map(|d| d.0));
    String::new()
}

/// Sets the detail of the next event row of each action in `p_ids` (jsonb
/// text, never param values; a NULL id or detail is skipped). Returns ''.
#[pg_extern(name = "_set_event_details", volatile, parallel_unsafe)]
fn set_event_details(
    p_ids: Option<Vec<Option<pgrx::Uuid>>>,
    p_details: Option<Vec<Option<String>>>,
) -> String {
    let pairs = p_ids
        .unwrap_or_default()
        .into_iter()
        .zip(p_details.unwrap_or_default());
    ACTOR.with(|a| {
        let mut a = a.borrow_mut();
        let actor = a.get_or_insert_with(Actor::default);
        for (id, detail) in pairs {
            if let (Some(id), Some(detail)) = (id, detail) {
                actor.details.insert(*id.as_bytes(), detail);
            }
        }
    });
    String::new()
}

/// The role keyturn noted for this transaction, or NULL for a status change
/// keyturn's functions did not make.
#[pg_extern(name = "_actor_role", volatile, parallel_unsafe)]
pub fn actor_role() -> Option<String> {
    ACTOR.with(|a| a.borrow().as_ref().and_then(|a| a.role.clone()))
}

#[pg_extern(name = "_actor_principal", volatile, parallel_unsafe)]
pub fn actor_principal() -> Option<String> {
    ACTOR.with(|a| a.borrow().as_ref().and_then(|a| a.principal.clone()))
}

/// The detail for the next event row (the detail merged with the context),
/// as jsonb text, or NULL.
#[pg_extern(name = "_event_detail", volatile, parallel_unsafe)]
pub fn event_detail() -> Option<String> {
    event_detail_of(None)
}

/// The detail for the next event row of action `id`: its own detail if one
/// was set (which it forgets), else the one for every action.
pub fn event_detail_of(id: Option<pgrx::Uuid>) -> Option<String> {
    ACTOR.with(|a| {
        let mut a = a.borrow_mut();
        let a = a.as_mut()?;
        let own = id.and_then(|id| a.details.remove(id.as_bytes()));
        let detail = own.as_ref().or(a.detail.as_ref());
        // A decision in a card session says so: a link's holder may not be
        // its person (sixteenth red-team pass, docs/security.md row 115).
        // Never for an agent's call, which may assert the claims' mark
        // itself but opens no card session (eighteenth pass, row 122).
        let via_link = crate::identity::in_card_session() && !crate::privilege::outer_is_agent();
        if a.context.is_empty() && !via_link {
            return detail.cloned();
        }
        let mut merged = match detail.map(|d| serde_json::from_str(d)) {
            Some(Ok(serde_json::Value::Object(m))) => m,
            _ => serde_json::Map::new(),
        };
        if via_link {
            merged
                .entry("via")
                .or_insert_with(|| serde_json::Value::from("card_session"));
        }
        // The event's own detail wins over a context's key of the same name.
        for (_, context) in a.context.iter().rev() {
            for (k, v) in context {
                merged.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Some(serde_json::Value::Object(merged).to_string())
    })
}

/// Whether one of keyturn's own functions is acting in this transaction.
#[pg_extern(name = "_acting", volatile, parallel_unsafe)]
pub fn acting() -> bool {
    ACTOR.with(|a| a.borrow().is_some())
}
