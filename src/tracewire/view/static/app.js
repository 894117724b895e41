// Router of the viewer: "#/" is the run's index, "#/episodes/ID" an episode.
import { api, el, showError } from "./util.js";
import { renderRun } from "./runpage.js";
import { renderEpisode } from "./episode.js";

let cleanup = null;

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  const app = document.getElementById("app");
  app.replaceChildren(el("p", { class: "muted" }, "loading…"));
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/episodes\/([A-Za-z0-9_-]+)(?:\?(.*))?$/);
  try {
    if (m) cleanup = await renderEpisode(app, m[1], new URLSearchParams(m[2] || ""));
    else cleanup = await renderRun(app, new URLSearchParams(hash.split("?")[1] || ""));
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
