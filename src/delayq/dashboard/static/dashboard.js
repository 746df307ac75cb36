// Reload the live figures of the page every few seconds without a full reload: fetch the same
// URL and swap the element marked data-live. Pauses while the tab is hidden or when unticked.
(function () {
  "use strict";
  const live = document.querySelector("[data-live]");
  const box = document.getElementById("autorefresh");
  const every = Number(document.body.dataset.refresh || 0) * 1000;
  if (!live || !box || !every) return;
  async function refresh() {
    if (!box.checked || document.hidden) return;
    try {
      const response = await fetch(location.href, { credentials: "same-origin" });
      const html = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = html.querySelector("[data-live]");
      if (fresh) live.replaceChildren(...fresh.childNodes);
      document.body.dataset.refreshed = String(Date.now());
    } catch (error) {
      document.body.dataset.refreshError = String(error);
    }
  }
  setInterval(refresh, every);
})();
