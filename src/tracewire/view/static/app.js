// Router of the viewer: "#/" the run's index, "#/episodes/ID" an episode, "#/groups" the
// groups of rollouts, "#/groups/KEY" one group, "#/diff?a=&b=" two rollouts, "#/compare"
// run against run.
import { api, el, showError } from "./util.js";
import { resetKeys } from "./keys.js";
import { renderRun } from "./runpage.js";
import { renderEpisode } from "./episode.js";
import { renderGroups, renderGroup } from "./groups.js";
import { renderDiff } from "./diff.js";
import { renderCompare } from "./compare.js";

let cleanup = null;

function markNav(hash) {
  for (const a of document.querySelectorAll("nav.pages a")) {
    const page = a.dataset.page;
    const on = page === "index" ? /^#\/(\?|$|episodes)/.test(hash) || hash === "" : hash.startsWith("#/" + page);
    a.classList.toggle("on", on);
  }
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  resetKeys();
  const app = document.getElementById("app");
  app.replaceChildren(el("p", { class: "muted" }, "loading…"));
  const hash = location.hash || "#/";
  markNav(hash);
  const [path, query] = [hash.split("?")[0], new URLSearchParams(hash.split("?")[1] || "")];
  const ep = path.match(/^#\/episodes\/([A-Za-z0-9_-]+)$/);
  const group = path.match(/^#\/groups\/(.+)$/);
  try {
    if (ep) cleanup = await renderEpisode(app, ep[1], query);
    else if (group) cleanup = await renderGroup(app, decodeURIComponent(group[1]), query);
    else if (path === "#/groups") cleanup = await renderGroups(app, query);
    else if (path === "#/diff") cleanup = await renderDiff(app, query);
    else if (path === "#/compare") cleanup = await renderCompare(app, query);
    else cleanup = await renderRun(app, query);
  } catch (err) {
    showError(app, err);
  }
}

async function init() {
  try {
    const info = await api("/api/run");
    const name = (info.meta && (info.meta.name || info.meta.env)) || info.dir;
    document.getElementById("run-name").textContent = name;
    document.title = "tracewire · " + name;
  } catch (err) { /* the page itself reports errors */ }
  window.addEventListener("hashchange", route);
  await route();
}

init();
