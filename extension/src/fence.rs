//! Read-side fencing's SQL entry point: keyturn-core `fence` projects,
//! clips, redacts, neutralizes and marks; this keeps one compiled projection
//! per spec text for the backend, since a provider's spec changes only when
//! it is registered again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use keyturn_core::fence::{self, Projection};
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::error::OrRaise;
use crate::jsonb_text::JsonbText;

thread_local! {
    static COMPILED: RefCell<HashMap<String, Rc<Projection>>> = RefCell::new(HashMap::new());
}
const COMPILED_MAX: usize = 64;

fn compiled(spec: &JsonbText) -> Rc<Projection> {
    COMPILED.with(|cache| {
        if let Some(hit) = cache.borrow().get(&spec.0) {
            return Rc::clone(hit);
        }
        let projection = Rc::new(
            fence::compile(&keyturn_core::canonical::parse_bounded(&spec.0).or_raise()).or_raise(),
        );
        let mut cache = cache.borrow_mut();
        if cache.len() >= COMPILED_MAX {
            cache.clear();
        }
        cache.insert(spec.0.clone(), Rc::clone(&projection));
        projection
    })
}

/// Raises 22023 unless `spec` is a valid projection; returns it normalized.
#[pg_extern(name = "_check_projection", immutable, strict, parallel_safe)]
fn check_projection(spec: JsonbText) -> JsonB {
    JsonB(
        fence::check_projection(&keyturn_core::canonical::parse_bounded(&spec.0).or_raise())
            .or_raise(),
    )
}

/// The fenced reference block for a provider's data under a projection spec,
/// with a fresh marker.
#[pg_extern(name = "_fence", volatile, strict, parallel_safe)]
fn fence_data(
    provider: &str,
    spec: JsonbText,
    data: JsonbText,
) -> TableIterator<
    'static,
    (
        name!(guard, String),
        name!(reference, String),
        name!(marker, String),
    ),
> {
    let projection = compiled(&spec);
    let data = keyturn_core::canonical::parse_bounded(&data.0).or_raise();
    let fenced = fence::fence(provider, &projection, &data);
    TableIterator::once((fenced.guard, fenced.reference, fenced.marker.open()))
}
