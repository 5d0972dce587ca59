//! The type an sql tool's form values are read in: the column's type without
//! its size or precision (`character varying(5)` → `character varying`,
//! `numeric(12,2)` → `numeric`, a domain → its base type, likewise).
//!
//! Why: an explicit cast to a sized type cuts or rounds without a word
//! (`'admin_readonly'::varchar(5)` is `admin`, `0.004::numeric(12,2)` is
//! `0.00`), so a value cast that way is not the value the person approved
//! (docs/security.md, row 126). Read in the loose type, a value keeps every
//! character and digit; the column's own size then applies as an assignment,
//! which refuses what is too long, and what it rounds the postcondition sees.
//! propose refuses a value that does not fit before anyone is asked
//! (`keyturn._form_fit`, extension/src/form.rs).
//!
//! The names are the catalog's, read once per backend for each declared type
//! and forgotten when any type changes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

use pgrx::prelude::*;

use crate::error::KeyturnError;

/// A declared type's loose form.
#[derive(Clone)]
pub struct Loose {
    /// Its name, schema-qualified where that means anything, so it reads
    /// the same under any search_path.
    pub name: String,
    /// Whether it differs from the declared type (a size, or a domain): a
    /// value may then not be stored as it reads.
    pub sized: bool,
    /// How a value of it may be stored as another without a size.
    pub kind: Kind,
}

/// What a type does to a value without a size, and how keyturn checks it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Stores the value as it reads, or refuses it (text, numbers but
    /// floats, booleans, uuid, enums …).
    Exact,
    /// `json` or `jsonb` (or a domain over one): the canonical JSON value.
    Json,
    /// `real`: the nearest single-precision number.
    Float4,
    /// `double precision`: the nearest double.
    Float8,
    /// A date: read as a person reads it only in ISO form.
    Date,
    /// A time (`with_zone`: `timetz`): likewise, rounded to the microsecond.
    Time { with_zone: bool },
    /// A timestamp (`with_zone`: `timestamptz`): likewise.
    Timestamp { with_zone: bool },
    /// An interval: many spellings, one printed form; checked against it.
    Interval,
    /// An array: its text is checked against the printed form.
    Array,
}

thread_local! {
    static LOOSE: RefCell<Option<HashMap<String, Loose>>> = const { RefCell::new(None) };
}

/// The loose form of `declared` (a `format_type` text, as register_tool
/// stores a tool's column types).
pub fn loose(declared: &str) -> Loose {
    if let Some(known) = LOOSE.with(|l| l.borrow().as_ref().and_then(|m| m.get(declared).cloned()))
    {
        return known;
    }
    let name = look_up(declared);
    LOOSE.with(|l| {
        let mut l = l.borrow_mut();
        if l.is_none() {
            // SAFETY: registers a function of this library for the life of
            // the backend; the map it clears is this backend's.
            unsafe {
                pg_sys::CacheRegisterSyscacheCallback(
                    pg_sys::SysCacheIdentifier::TYPEOID as i32,
                    Some(forget),
                    pg_sys::Datum::from(0),
                );
            }
        }
        l.get_or_insert_with(HashMap::new)
            .insert(declared.to_owned(), name.clone());
    });
    name
}

fn look_up(declared: &str) -> Loose {
    let text = CString::new(declared).unwrap_or_else(|_| {
        KeyturnError::NotReady(format!("column type {declared:?} holds a NUL character")).raise()
    });
    let mut typid = pg_sys::Oid::INVALID;
    let mut typmod: i32 = -1;
    // SAFETY: parseTypeString reads a NUL-terminated name and writes the two
    // outputs; it raises (an ERROR, not a return) for a name that is no type.
    unsafe { pg_sys::parseTypeString(text.as_ptr(), &mut typid, &mut typmod, false) };
    // SAFETY: syscache lookups of an existing type's OID.
    let loose = unsafe {
        let element = pg_sys::get_element_type(typid);
        if element == pg_sys::Oid::INVALID {
            pg_sys::getBaseType(typid)
        } else {
            match pg_sys::get_array_type(pg_sys::getBaseType(element)) {
                array if array == pg_sys::Oid::INVALID => typid,
                array => array,
            }
        }
    };
    // TYPEMOD_GIVEN with -1: the names that mean a size when none is given
    // (character, bit) come out as bpchar and "bit", which mean none.
    // SAFETY: format_type_extended returns a palloc'd NUL-terminated string.
    let name = unsafe {
        let name = pg_sys::format_type_extended(
            loose,
            -1,
            (pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY) as u16,
        );
        CStr::from_ptr(name).to_string_lossy().into_owned()
    };
    let kind = match loose {
        // SAFETY: a syscache lookup of an existing type's OID.
        _ if unsafe { pg_sys::get_element_type(loose) } != pg_sys::Oid::INVALID => Kind::Array,
        pg_sys::JSONOID | pg_sys::JSONBOID => Kind::Json,
        pg_sys::FLOAT4OID => Kind::Float4,
        pg_sys::FLOAT8OID => Kind::Float8,
        pg_sys::DATEOID => Kind::Date,
        pg_sys::TIMEOID => Kind::Time { with_zone: false },
        pg_sys::TIMETZOID => Kind::Time { with_zone: true },
        pg_sys::TIMESTAMPOID => Kind::Timestamp { with_zone: false },
        pg_sys::TIMESTAMPTZOID => Kind::Timestamp { with_zone: true },
        pg_sys::INTERVALOID => Kind::Interval,
        _ => Kind::Exact,
    };
    Loose {
        name,
        sized: typmod >= 0 || loose != typid,
        kind,
    }
}

/// A type changed somewhere: every name is read again at its next use.
#[pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    LOOSE.with(|l| {
        if let Some(m) = l.borrow_mut().as_mut() {
            m.clear();
        }
    });
}
