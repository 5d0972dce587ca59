//! `jsonb` without pgrx's `JsonB`: as text (`JsonbText`), or passed through
//! untouched (`RawJsonb`).
//!
//! pgrx's own `JsonB` parses into a `serde_json::Value` with a hard `expect`,
//! and prints it back for PostgreSQL: a document nested deeper than
//! serde_json's limit (128), or one holding serde_json's reserved number key,
//! would surface as an internal error (XX000) or change. Arguments keyturn-core
//! must read come as their text, which it parses with its own bounds and
//! answers 22023 for; documents keyturn only carries (a business row's
//! columns, the state machine's results) stay PostgreSQL's, never parsed.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable,
};
use pgrx::{direct_function_call, direct_function_call_as_datum, FromDatum, IntoDatum};

/// The text of a `jsonb` argument, as `jsonb_out` prints it.
pub struct JsonbText(pub String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: the SQL signature declares this argument jsonb, so the datum is a
        // jsonb varlena; jsonb_out detoasts it and returns a palloc'd C string.
        unsafe {
            let cstr = direct_function_call::<&core::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])?;
            // jsonb_out only ever prints valid UTF-8 in a UTF-8 database; in other
            // encodings lossy conversion keeps us from panicking.
            let text = cstr.to_string_lossy().into_owned();
            pg_sys::pfree(cstr.as_ptr() as *mut core::ffi::c_void);
            Some(JsonbText(text))
        }
    }
}

/// A Rust type that is `jsonb` in SQL signatures: unboxed as an argument by
/// its FromDatum, which reads the datum only as the jsonb the signature
/// declares.
macro_rules! jsonb_in_sql {
    ($t:ident) => {
        // SAFETY: unboxing goes through the type's FromDatum, which reads the
        // datum only as the jsonb its SQL signature declares.
        unsafe impl<'fcx> ArgAbi<'fcx> for $t {
            unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                // SAFETY: forwarded contract of ArgAbi: the datum is a non-null jsonb.
                unsafe { arg.unbox_arg_using_from_datum() }
                    .unwrap_or_else(|| panic!("argument {index} must not be null"))
            }
        }

        // SAFETY: the SQL type named here (jsonb) is the type FromDatum expects.
        unsafe impl SqlTranslatable for $t {
            const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!($t);
            const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
                pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
            const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> =
                Ok(SqlMappingRef::literal("jsonb"));
            const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
                Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
        }
    };
}

jsonb_in_sql!(JsonbText);

/// A `jsonb` datum carried as PostgreSQL made it: copied into the current
/// memory context (pgrx reads SPI results in the caller's), never parsed.
#[derive(Clone, Copy)]
pub struct RawJsonb(pg_sys::Datum);

impl RawJsonb {
    /// `jsonb_in` of `text`, which keyturn builds from `jsonb_out` output.
    pub fn parse(text: &str) -> RawJsonb {
        let text = std::ffi::CString::new(text)
            .unwrap_or_else(|_| pgrx::error!("keyturn: a jsonb text held a NUL byte"));
        // SAFETY: jsonb_in takes one C string and returns a jsonb datum (or raises).
        let datum = unsafe {
            direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())])
        };
        RawJsonb(datum.unwrap_or_else(|| pgrx::error!("keyturn: jsonb_in returned NULL")))
    }

    /// `jsonb_out` of the datum.
    pub fn text(self) -> String {
        // SAFETY: the datum is a jsonb varlena (FromDatum or parse made it).
        unsafe {
            let cstr = direct_function_call::<&core::ffi::CStr>(pg_sys::jsonb_out, &[Some(self.0)])
                .unwrap_or_else(|| pgrx::error!("keyturn: jsonb_out returned NULL"));
            let text = cstr.to_string_lossy().into_owned();
            pg_sys::pfree(cstr.as_ptr() as *mut core::ffi::c_void);
            text
        }
    }
}

impl FromDatum for RawJsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-null jsonb varlena (the signature or the SPI column's
        // type, checked by pgrx, says so); the copy outlives an SPI result.
        let copy = unsafe { pg_sys::pg_detoast_datum_copy(datum.cast_mut_ptr()) };
        Some(RawJsonb(pg_sys::Datum::from(copy)))
    }
}

impl IntoDatum for RawJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: the datum returned is the jsonb this value holds, allocated in the
// function's memory context or one that outlives it.
unsafe impl BoxRet for RawJsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        // SAFETY: forwarded contract of BoxRet.
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

jsonb_in_sql!(RawJsonb);
