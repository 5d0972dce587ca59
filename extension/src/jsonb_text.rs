//! `jsonb` arguments as their text form, unparsed.
//!
//! pgrx's own `JsonB` argument parses into a `serde_json::Value` with a hard
//! `expect`: a document nested deeper than serde_json's limit (128) would surface
//! as an internal error (XX000). Taking the text lets keyturn-core parse it with
//! its own bounds and answer 22023 with a message that says what to do.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable,
};
use pgrx::{direct_function_call, FromDatum};

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

// SAFETY: unboxing goes through FromDatum above, which reads the datum only
// as the jsonb its SQL signature declares.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: forwarded contract of ArgAbi: the datum is a non-null jsonb.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }
}

// SAFETY: the SQL type named here (jsonb) is the type FromDatum expects.
unsafe impl SqlTranslatable for JsonbText {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbText);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
        pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}
