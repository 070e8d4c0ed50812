//! The command blocks of the guides (`README.md`, `docs/*.md`), as tests read them: every
//! ```` ```sh ```` block with the HTML comment right above its fence (which says who runs it),
//! and what a block must print — its `# → ` lines, in order, where `…` stands for any text.

/// One ```` ```sh ```` block of a guide.
#[derive(Debug, Clone)]
pub struct Block {
    /// The guide's line the fence opens on (1-based), for messages.
    pub line: usize,
    /// The HTML comment on the line right above the fence, without `<!--`/`-->`
    /// (`walkthrough:services`, `not run: …`), if there is one.
    pub marker: Option<String>,
    /// The block's text, without its fences.
    pub body: String,
}

/// The ```` ```sh ```` blocks of `text`, in order.
pub fn sh_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "```sh" {
            let marker = i
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .and_then(|l| l.strip_prefix("<!--"))
                .and_then(|l| l.strip_suffix("-->"))
                .map(|m| m.trim().to_string());
            let start = i;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && lines[i].trim_end() != "```" {
                body.push(lines[i]);
                i += 1;
            }
            blocks.push(Block {
                line: start + 1,
                marker,
                body: body.join("\n"),
            });
        }
        i += 1;
    }
    blocks
}

/// Whether `line` matches `pattern`, where `…` stands for any text.
pub fn matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == pattern;
    }
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The first `# → ` line of `block` that no line of `printed` matches (in order), if any.
pub fn missing_output(block: &str, printed: &str) -> Option<String> {
    let mut lines = printed.lines();
    block
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("# → "))
        .find(|expected| !lines.any(|line| matches(expected, line)))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ellipsis_stands_for_any_text() {
        assert!(matches("{\"id\":…}", "{\"id\":\"a1\"}"));
        assert!(matches("a…b…c", "a-b-c"));
        assert!(!matches("a…b…c", "a-c-b"));
        assert!(!matches("abc", "abcd"));
        assert!(!matches("ab…ba", "aba"), "the two ends may not overlap");
    }

    #[test]
    fn blocks_carry_the_comment_above_their_fence() {
        let text = "intro\n<!-- walkthrough:x -->\n```sh\necho 1\n# → 1\n```\n\n```sh\necho 2\n```\n```text\nno\n```\n";
        let blocks = sh_blocks(text);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].marker.as_deref(), Some("walkthrough:x"));
        assert_eq!((blocks[0].line, blocks[0].body.as_str()), (3, "echo 1\n# → 1"));
        assert_eq!((blocks[1].marker.as_deref(), blocks[1].line), (None, 8));
        assert_eq!(missing_output(&blocks[0].body, "0\n1\n"), None);
        assert_eq!(missing_output(&blocks[0].body, "0\n2\n").as_deref(), Some("1"));
    }
}
