// Drives the run viewer in headless Chromium (Debian's package) with
// playwright-core: runs the calculator, then the payer through an approval
// round trip, checks the timeline's rows, and saves a screenshot.
//
// Usage: node viewer_browser.cjs BASE_URL SCREENSHOT_PATH
// Env: TOWER_AGENT_PLAYWRIGHT (the playwright-core folder), TOWER_AGENT_CHROMIUM.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require(process.env.TOWER_AGENT_PLAYWRIGHT);

const [base, screenshot] = process.argv.slice(2);

function check(cond, what) {
  if (!cond) throw new Error("viewer check failed: " + what);
}

(async () => {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "tower-agent-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.TOWER_AGENT_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1100, height: 900 },
  });
  const errors = [];
  try {
    const page = await context.newPage();
    page.on("pageerror", (e) => errors.push(String(e)));
    page.setDefaultTimeout(15000);
    await page.goto(base + "/");
    await page.waitForSelector("body[data-ready=true]");

    // A run with a tool call: turns, model calls with latency, the tool with
    // its arguments and result, the final answer with usage.
    await page.selectOption("#agent", "calc");
    await page.fill("#input", "What is 2 + 3?");
    await page.click("#run");
    await page.waitForSelector("[data-kind=final]");
    const calc = await page.evaluate(() => ({
      turns: document.querySelectorAll("[data-kind=turn]").length,
      models: [...document.querySelectorAll("[data-kind=model]")].map((r) => r.textContent),
      tools: [...document.querySelectorAll("[data-kind=tool]")].map((r) => r.textContent),
      middleware: document.querySelectorAll("[data-kind=middleware]").length,
      final: document.querySelector("[data-kind=final]").textContent,
      latency: [...document.querySelectorAll("[data-kind=model]")].every((r) => r.dataset.latencyMs !== undefined),
    }));
    check(calc.turns === 2, "two turns: " + JSON.stringify(calc));
    check(calc.models.length === 2 && calc.models.every((m) => m.includes("scripted") && m.includes(" ms")), "model rows: " + calc.models);
    check(calc.latency, "model rows carry a latency");
    check(calc.tools.length === 1 && calc.tools[0].includes("add") && calc.tools[0].includes('"a": 2') && calc.tools[0].includes("5"), "tool row: " + calc.tools);
    check(calc.middleware > 0, "middleware rows");
    check(calc.final.includes("2 + 3 = 5") && calc.final.includes("usage"), "final row: " + calc.final);

    // An approval round trip: the run pauses, the button resumes it.
    await page.selectOption("#agent", "payer");
    await page.fill("#input", "Pay invoice 30");
    await page.click("#run");
    await page.waitForSelector("[data-kind=approval] button.approve");
    const approval = await page.textContent("[data-kind=approval]");
    check(approval.includes("pay") && approval.includes("30"), "approval row: " + approval);
    await page.screenshot({ path: screenshot.replace(/\.png$/, "-approval.png"), fullPage: true });
    await page.click("[data-kind=approval] button.approve");
    await page.waitForSelector("[data-kind=final]");
    const paid = await page.evaluate(() => ({
      final: document.querySelector("[data-kind=final]").textContent,
      approvalMeta: document.querySelector("[data-kind=approval] .meta").textContent,
      tools: [...document.querySelectorAll("[data-kind=tool]")].map((r) => r.textContent),
      status: document.getElementById("status").textContent,
    }));
    check(paid.approvalMeta === "approved", "approval recorded: " + paid.approvalMeta);
    check(paid.final.includes("payment sent"), "resumed to the end: " + paid.final);
    check(paid.tools.some((t) => t.includes("pay") && t.includes("paid 30")), "the approved tool ran: " + paid.tools);
    check(paid.status.includes("completed"), "status: " + paid.status);
    await page.screenshot({ path: screenshot, fullPage: true });
    check(errors.length === 0, "page errors: " + errors.join("; "));
    console.log(JSON.stringify({ ok: true, calc, paid }));
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
