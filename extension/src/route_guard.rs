//! The tenant a tenant-explicit call (`propose_for`, `lease_for`, …) names:
//! never NULL or blank ([`require_tenant`], 22023, the one rule for every
//! `_for` call), and refused as such before Citus routes the call
//! ([`register`]).
//!
//! Where keyturn's tables are distributed (docs/scale-out.md, layout B),
//! `keyturn.citus_distribute()` registers each `_for` call with Citus, whose
//! planner then hashes the tenant argument to pick the worker. A NULL there
//! crashes the backend in Citus 13.2 (a NULL datum hashed as text: signal
//! 11, and the postmaster restarts every connection of the node), before any
//! keyturn code runs. Any role that may call one `_for` function, an agent
//! included, could take the coordinator down with one statement. So
//! pg_keyturn installs a planner hook that runs before Citus's and refuses
//! such a call with keyturn's own error. It protects a backend from the
//! moment pg_keyturn is loaded there, hence the rule that on Citus it is in
//! `shared_preload_libraries` (`citus_distribute` refuses otherwise,
//! `check_deployment` reports it).

use std::ffi::CStr;

use pgrx::list::old_list::PgList;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::error::KeyturnError;

/// The tenant a `_for` call acts in; raises 22023 when it names none.
pub fn require_tenant<'a>(what: &str, tenant: Option<&'a str>) -> &'a str {
    match tenant {
        Some(t) if !t.trim().is_empty() => t,
        _ => KeyturnError::InvalidArgument {
            message: format!("{what} needs the tenant it acts in"),
            hint: "Name the tenant: the caller's own for a person's or an agent's call; a job's tenant for the dispatcher's (lease_for returns it, tenants_due lists the tenants with work due).",
        }
        .raise(),
    }
}

/// [`require_tenant`] for the `_for` calls written in SQL (the dispatcher's
/// and the operator's): one rule, one place.
#[pg_extern(name = "_require_tenant", immutable, parallel_safe)]
fn require_tenant_sql(p_tenant: Option<&str>, p_what: &str) -> String {
    require_tenant(p_what, p_tenant).to_owned()
}

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

/// Installs the planner hook, in front of whatever planner hook is there
/// (Citus's, when Citus is loaded first: `shared_preload_libraries =
/// 'citus,pg_keyturn'`).
pub fn register() {
    // SAFETY: called once per backend from _PG_init, before any planning;
    // the previous hook is kept and called.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(plan);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: std::ffi::c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the planner's own arguments, read before it runs.
    unsafe {
        refuse_null_tenant(parse, bound_params);
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// Raises [`require_tenant`]'s error for a statement of the shapes Citus
/// sends whole to a worker (`SELECT f(…)`, `SELECT … FROM f(…)`) whose
/// function is one of keyturn's `_for` calls and whose tenant, the first
/// argument, folds to NULL ([`folds_to_null`]). Any other statement passes
/// untouched, at the cost of a look at its top level.
///
/// # Safety
/// `parse` is the query being planned, `params` its bound parameters or NULL.
unsafe fn refuse_null_tenant(parse: *mut pg_sys::Query, params: pg_sys::ParamListInfo) {
    // SAFETY: the planner's query and its lists, read only.
    unsafe {
        let query = &*parse;
        if query.commandType != pg_sys::CmdType::CMD_SELECT {
            return;
        }
        let targets = PgList::<pg_sys::TargetEntry>::from_pg(query.targetList);
        if targets.len() == 1 {
            if let Some(entry) = targets.get_ptr(0) {
                check_call((*entry).expr.cast(), params);
            }
        }
        if query.jointree.is_null() {
            return;
        }
        let from = PgList::<pg_sys::Node>::from_pg((*query.jointree).fromlist);
        if from.len() != 1 {
            return;
        }
        let Some(item) = from.get_ptr(0) else { return };
        if !pgrx::is_a(item, pg_sys::NodeTag::T_RangeTblRef) {
            return;
        }
        let index = (*item.cast::<pg_sys::RangeTblRef>()).rtindex;
        let rte = pg_sys::rt_fetch(index as pg_sys::Index, query.rtable);
        if (*rte).rtekind != pg_sys::RTEKind::RTE_FUNCTION {
            return;
        }
        let functions = PgList::<pg_sys::RangeTblFunction>::from_pg((*rte).functions);
        if functions.len() == 1 {
            if let Some(f) = functions.get_ptr(0) {
                check_call((*f).funcexpr, params);
            }
        }
    }
}

/// [`refuse_null_tenant`] for one expression.
///
/// # Safety
/// `node` is an expression of the query being planned, or NULL.
unsafe fn check_call(node: *mut pg_sys::Node, params: pg_sys::ParamListInfo) {
    // SAFETY: nodes of the query being planned, read only; the catalog
    // lookups return palloc'd copies or InvalidOid.
    unsafe {
        if !pgrx::is_a(node, pg_sys::NodeTag::T_FuncExpr) {
            return;
        }
        let call = &*node.cast::<pg_sys::FuncExpr>();
        // Two catalog-cache lookups decide whether the call is keyturn's;
        // only then is its tenant folded.
        let keyturn = pg_sys::get_namespace_oid(c"keyturn".as_ptr(), true);
        if keyturn == pg_sys::Oid::INVALID || pg_sys::get_func_namespace(call.funcid) != keyturn {
            return;
        }
        let name = pg_sys::get_func_name(call.funcid);
        if name.is_null() {
            return;
        }
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        if !name.ends_with("_for") || name.starts_with('_') {
            return;
        }
        if first_argument(call).is_some_and(|tenant| folds_to_null(tenant, params)) {
            require_tenant(&name, None);
        }
    }
}

/// The call's first argument, given by position or by name (`tenant =>`):
/// before planning, a named argument is still wrapped, where it was written.
///
/// # Safety
/// `call` is an expression of the query being planned.
unsafe fn first_argument(call: &pg_sys::FuncExpr) -> Option<*mut pg_sys::Node> {
    // SAFETY: the call's argument list and its nodes, read only.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg(call.args);
        for i in 0..args.len() {
            let arg = args.get_ptr(i)?;
            if pgrx::is_a(arg, pg_sys::NodeTag::T_NamedArgExpr) {
                let named = &*arg.cast::<pg_sys::NamedArgExpr>();
                if named.argnumber == 0 {
                    return Some(named.arg.cast());
                }
            } else if i == 0 {
                return Some(arg);
            }
        }
        None
    }
}

/// Whether `node` is NULL once the planner has folded it, as Citus then
/// sees it: a NULL constant, a parameter bound to NULL, or any expression of
/// them the planner evaluates (`lower(NULL)`, `NULLIF('a', 'a')`). Folded
/// here the way the planner folds it, with the statement's bound parameters
/// (those it may treat as constants); what does not fold to a constant,
/// Citus does not route, and the call itself refuses a NULL when it runs.
///
/// # Safety
/// `node` is an expression of the query being planned; `params` its bound
/// parameters or NULL.
unsafe fn folds_to_null(node: *mut pg_sys::Node, params: pg_sys::ParamListInfo) -> bool {
    // SAFETY: a copy of the expression is folded, in the planner's memory
    // context; the planner state holds only what folding reads (the bound
    // parameters) and the lists it appends its dependencies to.
    unsafe {
        let glob = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlannerGlobal>())
            .cast::<pg_sys::PlannerGlobal>();
        (*glob).type_ = pg_sys::NodeTag::T_PlannerGlobal;
        (*glob).boundParams = params;
        let root = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlannerInfo>())
            .cast::<pg_sys::PlannerInfo>();
        (*root).type_ = pg_sys::NodeTag::T_PlannerInfo;
        (*root).glob = glob;
        let copy = pg_sys::copyObjectImpl(node.cast()).cast::<pg_sys::Node>();
        let folded = pg_sys::strip_implicit_coercions(pg_sys::eval_const_expressions(root, copy));
        pgrx::is_a(folded, pg_sys::NodeTag::T_Const)
            && (*folded.cast::<pg_sys::Const>()).constisnull
    }
}
