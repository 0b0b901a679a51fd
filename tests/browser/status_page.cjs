// Looks at Weir's status page in headless Chromium as a person would: opens it, signs in
// with a key through the form, and reads what the page shows. Prints one JSON object:
// { title, signInError, who, rows: [{pipeline, cells}], charts: [{pipeline, chart, points,
//   caption, max, width, height}], errors: [[cells]] }.
//
// Usage: node status_page.cjs URL KEY [SCREENSHOT.png]
// Env: WEIR_PLAYWRIGHT (path of the playwright-core package; deploy/local/browser.sh prints
// it), WEIR_CHROMIUM (default /usr/bin/chromium).
'use strict';
const { chromium } = require(process.env.WEIR_PLAYWRIGHT);

const [url, key, screenshot] = process.argv.slice(2);

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.WEIR_CHROMIUM || '/usr/bin/chromium',
    // Without the background-networking flags Chromium tries Google's hosts at every start.
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
    await page.goto(url);
    await page.getByLabel('API key').fill(key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForLoadState('load');
    const seen = await page.evaluate(() => {
      const text = (el) => (el ? el.textContent.trim() : null);
      return {
        title: document.title,
        signInError: text(document.querySelector('p.error')),
        who: text(document.querySelector('#who')),
        rows: [...document.querySelectorAll('#pipelines tbody tr')].map((tr) => ({
          pipeline: tr.dataset.pipeline,
          cells: [...tr.querySelectorAll('td')].map(text),
        })),
        charts: [...document.querySelectorAll('section.pipeline figure')].map((f) => {
          const svg = f.querySelector('svg').getBoundingClientRect();
          return {
            pipeline: f.closest('section').dataset.pipeline,
            chart: f.dataset.chart,
            points: f.querySelector('polyline').getAttribute('points').trim().split(/\s+/)
              .filter((p) => p.length > 0).length,
            caption: text(f.querySelector('figcaption')),
            max: Number(f.dataset.max),
            width: svg.width,
            height: svg.height,
          };
        }),
        errors: [...document.querySelectorAll('#errors tbody tr')].map((tr) =>
          [...tr.querySelectorAll('td')].map(text)),
      };
    });
    if (screenshot) {
      await page.screenshot({ path: screenshot, fullPage: true });
    }
    process.stdout.write(JSON.stringify(seen));
  } finally {
    await browser.close();
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
