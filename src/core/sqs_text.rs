//! SQS's characters. A message body or string attribute value may hold only `#x9 | #xA | #xD |
//! #x20–#xD7FF | #xE000–#xFFFD | #x10000–#x10FFFF`; SQS refuses a message with any other
//! (`InvalidMessageContents`). serde_json writes U+FFFE and U+FFFF raw (JSON allows them), so
//! every JSON text the product builds for SQS goes through [`json`].

/// Whether SQS takes `c` in a message body or string attribute value.
#[cfg(any(test, feature = "internals"))]
pub fn takes(c: char) -> bool {
    matches!(c as u32, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF)
}

/// The first character of `s` SQS refuses, if any.
#[cfg(any(test, feature = "internals"))]
pub fn refused(s: &str) -> Option<char> {
    s.chars().find(|c| !takes(*c))
}

/// `text`, a JSON text, with U+FFFE and U+FFFF written as the escapes `\ufffe` and `\uffff`:
/// the same JSON value in characters SQS takes. Escaping, not replacing, keeps the value: a job
/// id or an error text reads back as it was. Such a character can only stand inside a JSON
/// string, where the escape means the same. No other character SQS refuses can be in a valid
/// JSON text: control characters are escaped in strings (whitespace outside them is `\t`,
/// `\n`, `\r` or a space) and UTF-8 holds no surrogate.
pub fn json(text: String) -> String {
    if !text.contains(['\u{fffe}', '\u{ffff}']) {
        return text;
    }
    text.replace('\u{fffe}', "\\ufffe").replace('\u{ffff}', "\\uffff")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    #[test]
    fn the_characters_sqs_takes_are_its_documented_ranges() {
        for c in [
            '\t',
            '\n',
            '\r',
            ' ',
            '~',
            '\u{d7ff}',
            '\u{e000}',
            '\u{fffd}',
            '\u{10000}',
            '\u{10ffff}',
        ] {
            assert!(takes(c), "{c:?}");
        }
        for c in ['\0', '\u{8}', '\u{b}', '\u{1f}', '\u{fffe}', '\u{ffff}'] {
            assert!(!takes(c), "{c:?}");
        }
        assert_eq!(refused("ok \u{ffff} \u{1}"), Some('\u{ffff}'));
        assert_eq!(refused("ok"), None);
    }

    proptest::proptest! {
        /// Any string written as JSON and escaped holds only characters SQS takes, and reads
        /// back as the same string.
        #[test]
        fn an_escaped_json_string_is_sqs_text_and_the_same_value(
            s in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::char::any(),
                    proptest::sample::select(vec!['\u{fffe}', '\u{ffff}', '\0', '\u{1f}', '"', '\\']),
                ],
                0..40,
            ).prop_map(|cs| cs.into_iter().collect::<String>()),
        ) {
            let text = json(serde_json::to_string(&s).unwrap());
            proptest::prop_assert_eq!(refused(&text), None, "{}", text);
            proptest::prop_assert_eq!(serde_json::from_str::<String>(&text).unwrap(), s);
        }
    }
}
