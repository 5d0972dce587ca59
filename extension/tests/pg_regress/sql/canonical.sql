-- RFC 8785 canonical JSON and the params hash, as SQL callers see them.
SELECT keyturn.canonical_json('[56, {"d": true, "10": null, "1": []}]');
SELECT keyturn.canonical_json('{"peach": "This sorting order", "péché": "is wrong according to French", "pêche": "but canonicalization MUST", "sin": "ignore locale"}');
SELECT keyturn.canonical_json('{"numbers": [1E30, 4.50, 2e-3, 0.000000000000000000000000001], "literals": [null, true, false]}');
SELECT keyturn.canonical_json('{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\u000a": "Newline", "1": "One", "\u0080": "Control\u007f", "\ud83d\ude02": "Smiley", "\u00f6": "Latin Small Letter O With Diaeresis", "\ufb33": "Hebrew Letter Dalet With Dagesh", "</script>": "Browser Challenge"}');
-- Numbers a double cannot hold exactly are refused: two values would share a hash.
SELECT keyturn.canonical_json('{"n": 9007199254740993}');
SELECT keyturn.canonical_json('{"n": 1152921504606846976}');
SELECT keyturn.canonical_json('{"n": 333333333.33333329}');
SELECT keyturn.canonical_json('{"n": 0.1}');
-- The hash covers tool and params together.
SELECT keyturn.params_hash('send_email', '{"to": "a@example.com"}')
     = encode(sha256(convert_to('{"params":{"to":"a@example.com"},"tool":"send_email"}', 'UTF8')), 'hex') AS hash_matches;
SELECT keyturn.params_hash('send_email', '{"to": "a@example.com"}')
    <> keyturn.params_hash('send_mail', '{"to": "a@example.com"}') AS tool_is_bound;
