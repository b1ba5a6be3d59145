//! A page as a browser shows it: Debian's `chromium`, headless, loading a URL and
//! running its scripts for a while of virtual time (timers fire, fetches are waited
//! for), then printing the DOM or taking a screenshot.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;

/// The virtual time a page's scripts get before the DOM is read: a few of the status
/// page's one-second updates.
const SCRIPT_TIME_MS: u32 = 3_500;

/// Headless Chromium with a profile of its own in `profile` (tests run in parallel)
/// and no sandbox (CI runs as root, where Chromium's own sandbox refuses to start).
fn chromium(profile: &Path) -> Command {
    let mut command = Command::new("chromium");
    command
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={SCRIPT_TIME_MS}"));
    command
}

/// The DOM of `url` once its scripts ran, serialized as HTML.
pub fn rendered_dom(url: &str, profile: &Path) -> Result<String> {
    let output = chromium(profile).arg("--dump-dom").arg(url).output().context("running chromium")?;
    if !output.status.success() {
        bail!("chromium --dump-dom {url}: {}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// A `width`×`height` PNG screenshot of `url`, once its scripts ran, into `png`.
pub fn screenshot(url: &str, profile: &Path, (width, height): (u32, u32), png: &Path) -> Result<()> {
    let output = chromium(profile)
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .context("running chromium")?;
    if !output.status.success() || !png.exists() {
        bail!("chromium --screenshot {url}: {}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

/// The text of the first element of `html` whose opening tag holds `attribute`
/// (`data-field="processed"`), up to its first child tag; `None` if none does.
pub fn text_after(html: &str, attribute: &str) -> Option<String> {
    let at = html.find(attribute)?;
    let start = at + html[at..].find('>')? + 1;
    let end = start + html[start..].find('<')?;
    Some(html[start..end].to_string())
}
