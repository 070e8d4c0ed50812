//! Bounds on what a plugin hands back that the host prints, logs or stores: one message, an
//! error text, a list of messages or changes. A plugin's memory limit bounds what it can return;
//! these bound what that costs afterwards (a 30 MB error message used to be logged and stored in
//! full). What is cut says so, with how much there was.

/// Longest log line or message.
pub const MAX_MESSAGE: usize = 4 * 1024;
/// Longest error text.
pub const MAX_ERROR: usize = 16 * 1024;
/// Most text kept from one call's messages, all together.
pub const MAX_MESSAGES_TOTAL: usize = 64 * 1024;
/// Longest JSON text of one changed value (current or desired) kept in a report.
pub const MAX_VALUE: usize = 16 * 1024;
/// Most changes kept in a report.
pub const MAX_CHANGES: usize = 200;

/// `text` made fit to store and print: each NUL (U+0000), which PostgreSQL's text cannot hold,
/// replaced by U+FFFD, then cut to at most `max` bytes ([`truncate`]).
pub fn storable(text: &mut String, max: usize) {
    if text.contains('\0') {
        *text = text.replace('\0', "\u{FFFD}");
    }
    truncate(text, max);
}

/// Cuts `text` to at most `max` bytes (at a character boundary) and says what was cut.
pub fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let total = text.len();
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&format!("… [cut: {total} bytes in all]"));
}

/// `messages` with each cut to [`MAX_MESSAGE`] and no more than [`MAX_MESSAGES_TOTAL`] of text in
/// all; a last line says how many were left out.
pub fn messages(messages: Vec<String>) -> Vec<String> {
    let mut kept = Vec::new();
    let mut used = 0;
    let total = messages.len();
    for mut message in messages {
        storable(&mut message, MAX_MESSAGE);
        if used + message.len() > MAX_MESSAGES_TOTAL {
            break;
        }
        used += message.len();
        kept.push(message);
    }
    if kept.len() < total {
        kept.push(format!("… [{} more messages not kept]", total - kept.len()));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_characters_are_replaced_before_a_text_is_cut() {
        let mut text = "bad\0byte\0".to_string();
        storable(&mut text, 100);
        assert_eq!(text, "bad\u{FFFD}byte\u{FFFD}");
        let mut long = "\0".repeat(100);
        storable(&mut long, 10);
        assert!(long.starts_with("\u{FFFD}\u{FFFD}\u{FFFD}…"), "{long}");
        assert!(!long.contains('\0'));
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary_and_say_so() {
        let mut text = "é".repeat(10_000);
        truncate(&mut text, 101);
        assert!(text.starts_with(&"é".repeat(50)));
        assert!(text.ends_with("… [cut: 20000 bytes in all]"), "{text}");
        let mut short = "ok".to_string();
        truncate(&mut short, 2);
        assert_eq!(short, "ok");
    }

    #[test]
    fn many_messages_keep_a_bounded_total() {
        let kept = messages(vec!["x".repeat(10_000); 1_000]);
        let text: usize = kept.iter().map(String::len).sum();
        assert!(text <= MAX_MESSAGES_TOTAL + 100, "{text}");
        assert_eq!(
            kept.last().unwrap(),
            &format!("… [{} more messages not kept]", 1_000 - (kept.len() - 1))
        );
    }
}
