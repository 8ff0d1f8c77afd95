// The one way the page talks to the proxy: same origin, the key from sessionStorage as a Bearer token.
const KEY = "onthejob.key";

export const getKey = () => sessionStorage.getItem(KEY);
export const setKey = (k) => sessionStorage.setItem(KEY, k);
export const forgetKey = () => sessionStorage.removeItem(KEY);

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(path, { method = "GET", body, query } = {}) {
  let url = path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
    if ([...q].length) url += "?" + q.toString();
  }
  const headers = { authorization: "Bearer " + (getKey() || "") };
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const msg = (data && data.error && data.error.message) || resp.statusText;
    throw new ApiError(resp.status, `${resp.status}: ${msg}`);
  }
  return data;
}

// A route that a later release adds: null when this proxy does not serve it yet (404 with no body of ours).
export async function optional(path, opts) {
  try {
    return await api(path, opts);
  } catch (e) {
    if (e.status === 404) return null;
    throw e;
  }
}

export const seg = (s) => encodeURIComponent(s);
