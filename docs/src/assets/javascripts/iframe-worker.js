/*
 * Web workers for pages opened from disk (file://).
 *
 * The site's search runs in a web worker, and a browser refuses to start a
 * worker from a file:// page (its origin is opaque).  Opened from disk, this
 * script replaces `Worker` with one that runs the worker's script in a hidden
 * iframe of the page: the page's `worker.postMessage(data)` becomes a
 * "message" event in the iframe, the script's `postMessage(data)` a
 * "message" event on the worker object, and `importScripts(...)` loads the
 * scripts in order (returning a promise, which the search worker awaits).
 * Served over http(s), it does nothing.
 *
 * The same idea as squidfunk's iframe-worker (MIT), which the Material
 * theme's offline plugin would load from a CDN; this copy is part of the
 * site, so that the site works from disk without a network.
 */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      const base = new URL(url, location.href).href;
      this.onmessage = null;
      this.onerror = null;
      this.pending = [];
      this.ready = false;
      this.iframe = document.createElement("iframe");
      this.iframe.hidden = true;
      this.iframe.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this.iframe);
      const scope = this.iframe.contentWindow;
      const doc = this.iframe.contentDocument;
      const load = (src) =>
        new Promise((resolve, reject) => {
          const script = doc.createElement("script");
          script.src = new URL(src, base).href;
          script.onload = resolve;
          script.onerror = () => reject(new Error(`could not load ${script.src}`));
          doc.head.appendChild(script);
        });
      scope.postMessage = (data) => this.emit("message", data);
      scope.importScripts = (...urls) =>
        urls.reduce((done, src) => done.then(() => load(src)), Promise.resolve());
      load(base).then(
        () => {
          this.ready = true;
          for (const data of this.pending.splice(0)) this.postMessage(data);
        },
        (error) => this.emit("error", error)
      );
    }

    emit(type, data) {
      const event =
        type === "message"
          ? new MessageEvent("message", { data })
          : new ErrorEvent("error", { error: data, message: String(data) });
      const handler = type === "message" ? this.onmessage : this.onerror;
      if (handler) handler.call(this, event);
      this.dispatchEvent(event);
    }

    postMessage(data) {
      if (!this.ready) {
        this.pending.push(data);
        return;
      }
      const scope = this.iframe.contentWindow;
      scope.dispatchEvent(new scope.MessageEvent("message", { data }));
    }

    terminate() {
      this.iframe.remove();
      this.ready = false;
      this.pending = [];
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
