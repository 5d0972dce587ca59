//! What `"format": "email"` accepts: a bare addr-spec, nothing more.
//!
//! RFC 5322 allows far more than an address in an address field: display
//! names (`"Ann" <ann@acme.com>`), quoted local parts, comments, IP literals.
//! Each lets the text a person approves differ from where mail goes: a display
//! name padded with spaces shows one address and delivers to another. So a
//! param declared as an email is held to the narrow shape below, and the
//! SMTP adapter calls [`is_bare_addr_spec`] again before sending, so nothing
//! else ever reaches a mail server:
//!
//! * `local@domain`, exactly one `@`, at most 254 octets in all (the longest
//!   path SMTP can carry, RFC 5321 §4.5.3.1.3 less the angle brackets);
//! * the local part a dot-atom: RFC 5322 `atext` (letters, digits and
//!   ``!#$%&'*+-/=?^_`{|}~``) in dot-separated runs, no leading, trailing or
//!   doubled dot, at most 64 octets, never quoted;
//! * the domain a hostname: at least two dot-separated labels of letters,
//!   digits and inner hyphens, each 1 to 63 octets (the 254-octet bound on
//!   the whole keeps it under DNS's 253), no trailing dot, the last label not all digits (so `1.2.3.4` is no domain),
//!   and no IP literal (`[…]`). A single label would be completed from the
//!   mail server's own search domains, so it is refused too;
//! * ASCII only. An internationalized address can be written with letters
//!   that look like Latin ones (Cyrillic `а` in `аcme.com`), and the card is
//!   read at a glance on a phone; punycode (`xn--…`) domains are ASCII and
//!   pass, showing their real spelling.

/// Longest address, in octets.
pub const MAX_ADDRESS: usize = 254;
/// Longest local part, in octets.
pub const MAX_LOCAL: usize = 64;
/// Longest domain label, in octets.
pub const MAX_LABEL: usize = 63;

/// True when `s` is a bare addr-spec as described in the module docs.
pub fn is_bare_addr_spec(s: &str) -> bool {
    if !s.is_ascii() || s.len() > MAX_ADDRESS {
        return false;
    }
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    is_dot_atom(local) && is_hostname(domain)
}

/// RFC 5322 `dot-atom-text` (which already excludes `@`, quotes, spaces and
/// comments), at most [`MAX_LOCAL`] octets.
fn is_dot_atom(local: &str) -> bool {
    local.len() <= MAX_LOCAL
        && local
            .split('.')
            .all(|atom| !atom.is_empty() && atom.bytes().all(is_atext))
}

/// RFC 5322 `atext`.
fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b)
}

/// Two or more LDH labels, the last not all digits.
fn is_hostname(domain: &str) -> bool {
    let labels: Vec<&str> = domain.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| is_ldh_label(l))
        && labels
            .last()
            .is_some_and(|tld| !tld.bytes().all(|b| b.is_ascii_digit()))
}

/// Letters, digits and hyphens, not starting or ending with a hyphen.
fn is_ldh_label(label: &str) -> bool {
    (1..=MAX_LABEL).contains(&label.len())
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! addresses {
        ($($name:ident: $s:expr => $want:expr,)*) => {$(
            #[test]
            fn $name() {
                let s: &str = &$s;
                assert_eq!(is_bare_addr_spec(s), $want, "{s:?}");
            }
        )*};
    }

    addresses! {
        test_plain: "ann@example.com" => true,
        test_subdomain_and_plus: "a.b+tag@mail.sub.example.org" => true,
        test_upper_case: "Ann@Example.COM" => true,
        test_every_atext: "!#$%&'*+-/=?^_`{|}~09azAZ@example.com" => true,
        test_hyphen_and_digits_in_labels: "x@my-host1.example2.co" => true,
        test_punycode_domain: "ann@xn--bcher-kva.example" => true,
        test_numeric_inner_label: "ann@123.example.com" => true,
        test_local_64: format!("{}@example.com", "a".repeat(64)) => true,
        test_label_63: format!("a@{}.com", "b".repeat(63)) => true,
        test_total_254: format!("{}@{}.{}.{}.{}.com", "a".repeat(64), "b".repeat(63), "c".repeat(63), "d".repeat(36), "e".repeat(20)) => true,

        test_display_name: "Ann <ann@example.com>" => false,
        test_quoted_display_name: "\"ann@acme.com   \" <attacker@evil.example>" => false,
        test_angle_brackets_only: "<ann@example.com>" => false,
        test_quoted_local_part: "\"ann smith\"@example.com" => false,
        test_quoted_local_part_no_space: "\"ann\"@example.com" => false,
        test_comment: "ann(comment)@example.com" => false,
        test_comment_in_domain: "ann@(c)example.com" => false,
        test_space: "ann @example.com" => false,
        test_tab: "ann@example.com\t" => false,
        test_newline_header_injection: "ann@example.com\nBcc: x@evil.example" => false,
        test_leading_space: " ann@example.com" => false,
        test_ip_literal: "ann@[127.0.0.1]" => false,
        test_ipv6_literal: "ann@[IPv6:::1]" => false,
        test_dotted_quad_domain: "ann@127.0.0.1" => false,
        test_numeric_tld: "ann@example.123" => false,
        test_trailing_dot: "ann@example.com." => false,
        test_leading_dot_domain: "ann@.example.com" => false,
        test_double_dot_domain: "ann@example..com" => false,
        test_single_label: "ann@localhost" => false,
        test_leading_dot_local: ".ann@example.com" => false,
        test_trailing_dot_local: "ann.@example.com" => false,
        test_double_dot_local: "a..nn@example.com" => false,
        test_two_ats: "ann@acme.com@evil.example" => false,
        test_no_at: "ann.example.com" => false,
        test_empty_local: "@example.com" => false,
        test_empty_domain: "ann@" => false,
        test_empty: "" => false,
        test_hyphen_edges: "ann@-example.com" => false,
        test_hyphen_end: "ann@example-.com" => false,
        test_underscore_domain: "ann@ex_ample.com" => false,
        test_cyrillic_a_domain: "ann@\u{0430}cme.com" => false,
        test_cyrillic_local: "\u{0430}nn@acme.com" => false,
        test_fullwidth_at: "ann\u{FF20}acme.com" => false,
        test_zero_width_space: "ann@ac\u{200B}me.com" => false,
        test_unicode_domain: "ann@bücher.example" => false,
        test_backslash: "an\\n@example.com" => false,
        test_comma_list: "a@x.com,b@y.com" => false,
        test_semicolon_list: "a@x.com;b@y.com" => false,
        test_local_65: format!("{}@example.com", "a".repeat(65)) => false,
        test_label_64: format!("a@{}.com", "b".repeat(64)) => false,
        test_total_255: format!("{}@{}.{}.{}.{}.com", "a".repeat(64), "b".repeat(63), "c".repeat(63), "d".repeat(37), "e".repeat(20)) => false,
    }

    #[test]
    fn test_length_fixture_is_what_it_claims() {
        let longest = format!(
            "{}@{}.{}.{}.{}.com",
            "a".repeat(64),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(36),
            "e".repeat(20)
        );
        assert_eq!(longest.len(), MAX_ADDRESS);
    }
}
