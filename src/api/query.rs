//! Query strings, read the same way by every route that takes one (the
//! list, an operation's outcomes, the dead letters): each parameter once,
//! a parameter given twice or meaning nothing refused with a 400 that names
//! it, and the page parameters (`cursor`, `limit`) they share.

use std::collections::HashSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use uuid::Uuid;

use super::ApiError;
use crate::store::list::MAX_PAGE;

/// Longest metadata key or value, error prefix, or cursor a query may hold.
pub(super) const MAX_QUERY_TEXT: usize = 256;

/// Calls `take` with each parameter of `query` (decoded), in order. A name
/// given twice, or one `take` refuses (with why), is a 400:
/// "query parameter `limit`: not a whole number from 1 to 200".
pub(super) fn each_param(
    query: &str,
    mut take: impl FnMut(&str, &str) -> Result<(), String>,
) -> Result<(), ApiError> {
    let mut seen = HashSet::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let refused =
            |why: String| ApiError::BadRequest(format!("query parameter `{name}`: {why}"));
        if !seen.insert(name.clone()) {
            return Err(refused("given twice".into()));
        }
        take(&name, &value).map_err(refused)?;
    }
    Ok(())
}

/// A page size a query asks for: 1 to [`MAX_PAGE`].
pub(super) fn page_limit(value: &str) -> Result<i64, String> {
    match value.parse::<i64>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(format!("not a whole number from 1 to {MAX_PAGE}")),
    }
}

/// The cursor of a page that continues after job `id`.
pub(super) fn cursor_of(id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// A cursor [`cursor_of`] made.
pub(super) fn cursor(value: &str) -> Result<Uuid, String> {
    let bytes = URL_SAFE_NO_PAD.decode(value).ok();
    bytes
        .and_then(|bytes| Uuid::from_slice(&bytes).ok())
        .ok_or_else(|| "not a cursor".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(query: &str) -> String {
        let taken = each_param(query, |name, value| match name {
            "limit" => page_limit(value).map(drop),
            "cursor" => cursor(value).map(drop),
            _ => Err("unknown".into()),
        });
        match taken {
            Err(ApiError::BadRequest(why)) => why,
            other => panic!("{query}: {other:?}"),
        }
    }

    #[test]
    fn a_parameter_is_refused_by_name_once_and_only_once() {
        assert_eq!(
            refused("limit=0"),
            "query parameter `limit`: not a whole number from 1 to 200"
        );
        assert_eq!(
            refused("limit=1&limit=2"),
            "query parameter `limit`: given twice"
        );
        assert_eq!(
            refused("cursor=%21"),
            "query parameter `cursor`: not a cursor"
        );
        assert_eq!(refused("colour=red"), "query parameter `colour`: unknown");
    }

    #[test]
    fn a_cursor_is_the_id_it_was_made_of() {
        let id = Uuid::now_v7();
        assert_eq!(cursor(&cursor_of(id)), Ok(id));
    }
}
