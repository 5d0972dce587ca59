//! SPI plans kept for the life of the backend, keyed by statement text.
//!
//! The gate's entry points and `_exec_as` run the same few statements on every
//! call: parsing and planning them each time was the largest single cost the
//! profile showed (tests/bench/BENCHMARKS.md, P1). A kept plan lives in the
//! plan cache, so PostgreSQL still replans it when a referenced object changes,
//! when the search_path differs, or when row-level security depends on a role
//! other than the one it was planned for.
//!
//! Plans are shared through `Rc`, never through a held borrow: a statement may
//! call back into keyturn (approve → `_approve` → `_exec_as`) and use the cache
//! again while the outer statement is still running.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};

/// Enough for every tool version's statement shapes in a busy backend; past it
/// the cache starts over rather than grow without bound.
const KEPT_PLANS_MAX: usize = 256;

thread_local! {
    static KEPT: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

/// Executes `sql` (parameter types `types`) through a kept plan.
pub fn execute<'conn>(
    client: &mut SpiClient<'conn>,
    sql: &str,
    types: &[pg_sys::Oid],
    args: &[DatumWithOid<'_>],
) -> SpiResult<SpiTupleTable<'conn>> {
    let plan = match KEPT.with(|kept| kept.borrow().get(sql).cloned()) {
        Some(plan) => plan,
        None => {
            let oids: Vec<PgOid> = types.iter().map(|&oid| PgOid::Custom(oid)).collect();
            let plan = Rc::new(client.prepare_mut(sql, &oids)?.keep());
            KEPT.with(|kept| {
                let mut kept = kept.borrow_mut();
                if kept.len() >= KEPT_PLANS_MAX {
                    kept.clear();
                }
                kept.insert(sql.to_owned(), Rc::clone(&plan));
            });
            plan
        }
    };
    client.update(&*plan, None, args)
}
