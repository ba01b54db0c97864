// The live view: noVNC's RFB client on this origin's /websockify, which
// the server bridges to the desktop's VNC server in the sandbox. The page
// came with the preview's token in its URL, which the WebSocket carries
// too: in a frame of another site, a request may carry no cookie.
// ?view_only=1 watches without sending input.
import RFB from './novnc/core/rfb.js';

const status = document.getElementById('status');
const say = (text, cls) => { status.textContent = text; status.className = cls || ''; };
const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
const params = new URLSearchParams(location.search);
const token = params.get('runtime_preview_token');
const socket = scheme + location.host + '/websockify' + (token ? '?runtime_preview_token=' + encodeURIComponent(token) : '');
const rfb = new RFB(document.getElementById('screen'), socket);
rfb.scaleViewport = true;
rfb.resizeSession = false;
rfb.viewOnly = params.get('view_only') === '1';
rfb.addEventListener('connect', () => say(rfb.viewOnly ? 'live, view only' : 'live', 'ok'));
rfb.addEventListener('disconnect', (e) => say(e.detail.clean ? 'disconnected' : 'the connection was lost; reload to reconnect', 'bad'));
rfb.addEventListener('desktopname', (e) => { document.title = e.detail.name + ' · Emberbox'; });
