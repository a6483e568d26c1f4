/*
 * report/report_html.c: the self-contained HTML page of `stowage report` and
 * its one-line JSON summary (contract: report/report.h).
 *
 * The page carries no URL at all: inline CSS, one inline script, and the data
 * as compact JSON arrays that the script draws on canvases. What cannot be
 * drawn one by one is aggregated here, in C, so that the page stays small and
 * draws fast whatever the trace length: the memory curve as min/max buckets,
 * the N largest allocations as bars, and every other allocation as a heat map
 * of bytes alive per (time bucket, power-of-two size class).
 */
#include "report/report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define HEAT_COLUMNS 800
#define MAX_MARKERS 4000 /* step markers drawn; the first ones */

static void html_escape(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f); break;
        }
    }
}

/* "1.23 GiB" */
static void human(char *buf, size_t len, uint64_t bytes)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, unit[u]);
}

static void json_u64s(FILE *f, const char *key, const uint64_t *v, size_t n)
{
    fprintf(f, "\"%s\":[", key);
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? ",%" PRIu64 : "%" PRIu64, v[i]);
    fputs("]", f);
}

static void json_bucket_field(FILE *f, const char *key, const stow_bucket_t *b, size_t n,
                              int field)
{
    fprintf(f, "\"%s\":[", key);
    for (size_t i = 0; i < n; i++) {
        uint64_t v = field == 0 ? (uint64_t)b[i].first_event : field == 1 ? b[i].lo : b[i].hi;
        fprintf(f, i ? ",%" PRIu64 : "%" PRIu64, v);
    }
    fputs("]", f);
}

static int by_size_then_id(const void *a, const void *b)
{
    const stow_report_alloc_t *x = a, *y = b;
    if (x->size_bytes != y->size_bytes)
        return x->size_bytes > y->size_bytes ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static const char page_css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;background:#fff}"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}"
    ".cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}"
    ".card{border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:130px}"
    ".card b{display:block;font-size:17px}.card span{color:#666;font-size:12px}"
    "canvas{border:1px solid #ddd;display:block}"
    "table{border-collapse:collapse;font-size:12px}td,th{padding:2px 8px;border-bottom:1px solid #eee;"
    "text-align:right}th{background:#f5f5f5}td.l,th.l{text-align:left}"
    ".warn{background:#fff3cd;border:1px solid #e0c060;padding:6px 10px;border-radius:6px}"
    ".ok{color:#2a7a2a}.legend{font-size:12px;color:#444}.legend i{display:inline-block;"
    "width:12px;height:8px;margin:0 4px 0 12px}#tip{font-size:12px;color:#333;height:16px}"
    ".why{font-size:13px;color:#333;max-width:1300px;margin:4px 0 8px}";

/* The drawing script: reads D, draws three canvases (the third when there
 * are stranded-memory samples), then stamps the time it took into
 * document.title and body[data-drawn-ms] (read by the browser check). Every
 * chart shares the x axis: the event index, with the trace's step markers. */
static const char page_js[] =
    "(function(){var t0=performance.now();var D=JSON.parse(document.getElementById('data')"
    ".textContent);var L=60,R=12,T=10,B=24;"
    "function hb(v){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(v>=1024&&i<4){v/=1024;i++}"
    "return(i?v.toFixed(2):v)+' '+u[i]}"
    "function ctx(id){var c=document.getElementById(id),g=c.getContext('2d');"
    "g.font='11px sans-serif';return[c,g,c.width-L-R,c.height-T-B]}"
    "function xs(e,w){return L+e/Math.max(1,D.events-1)*w}"
    "function xaxis(g,w,h){g.fillStyle='#555';for(var i=0;i<=5;i++){var e=Math.round((D.events-1)"
    "*i/5);g.fillText((i?'':'event ')+e,Math.min(L+w-40,Math.max(L,xs(e,w)-12)),T+h+15)}}"
    "function axes(g,w,h,ymax,fmt){g.strokeStyle='#999';g.fillStyle='#555';g.beginPath();"
    "g.moveTo(L,T);g.lineTo(L,T+h);g.lineTo(L+w,T+h);g.stroke();for(var i=0;i<=4;i++){"
    "var y=T+h-h*i/4;g.fillText(fmt(ymax*i/4),2,y+4);g.strokeStyle='#eee';g.beginPath();"
    "g.moveTo(L+1,y);g.lineTo(L+w,y);g.stroke()}xaxis(g,w,h)}"
    "function mark(g,e,w,h,col,lab){var x=xs(e,w);g.strokeStyle=col;g.setLineDash([4,3]);"
    "g.beginPath();g.moveTo(x,T);g.lineTo(x,T+h);g.stroke();g.setLineDash([]);"
    "g.fillStyle=col;g.fillText(lab,Math.min(x+3,L+w-190),T+11)}"
    /* step markers: grey lines, keys where there is room */
    "function steps(g,w,h,lab){var S=D.steps,last=-1e9;g.strokeStyle='rgba(0,0,0,0.28)';"
    "g.fillStyle='#666';for(var i=0;i<S.ev.length;i++){var x=Math.round(xs(S.ev[i]-0.5,w))+0.5;"
    "g.beginPath();g.moveTo(x,T);g.lineTo(x,T+h);g.stroke();if(lab&&x-last>=70){"
    "g.fillText(S.key[i],x+2,T+h-4);last=x}}}"
    /* memory chart */
    "var m=ctx('mem'),g=m[1],w=m[2],h=m[3],M=D.mem,ym=Math.max(D.peak_reserved,D.peak_live,1)*1.05;"
    "function ys(v){return T+h-v/ym*h}axes(g,w,h,ym,hb);steps(g,w,h,1);var n=M.ev.length,i,x,x2;"
    "g.fillStyle='rgba(60,110,200,0.35)';g.beginPath();g.moveTo(L,ys(0));for(i=0;i<n;i++){"
    "x=xs(M.ev[i],w);g.lineTo(x,ys(M.hi[i]))}g.lineTo(L+w,ys(0));g.closePath();g.fill();"
    "g.fillStyle='rgba(60,110,200,0.9)';for(i=0;i<n;i++){x=xs(M.ev[i],w);x2=i+1<n?xs(M.ev[i+1],w):L+w;"
    "g.fillRect(x,ys(M.hi[i]),Math.max(1,x2-x),Math.max(1,ys(M.lo[i])-ys(M.hi[i])))}"
    "if(M.rhi){g.strokeStyle='#e07020';g.lineWidth=1.5;g.beginPath();for(i=0;i<n;i++){"
    "x=xs(M.ev[i],w);x2=i+1<n?xs(M.ev[i+1],w):L+w;if(i)g.lineTo(x,ys(M.rhi[i]));else "
    "g.moveTo(x,ys(M.rhi[i]));g.lineTo(x2,ys(M.rhi[i]))}g.stroke();g.lineWidth=1}"
    "mark(g,D.peak_live_event,w,h,'#c00','peak live '+hb(D.peak_live));"
    "if(D.growth.ev.length){g.fillStyle=D.growth.leak?'#c00':'#080';for(i=0;i<D.growth.ev.length;i++){"
    "g.beginPath();g.arc(xs(D.growth.ev[i],w),ys(D.growth.live[i]),4,0,7);g.fill()}}"
    "m[0].onmousemove=function(ev){var r=m[0].getBoundingClientRect(),e=(ev.clientX-r.left-L)/w*"
    "(D.events-1),lo=0,hi=n-1;while(lo<hi){var mid=(lo+hi+1)>>1;if(M.ev[mid]<=e)lo=mid;else hi=mid-1}"
    "document.getElementById('tip').textContent=e<0?'':'events '+M.ev[lo]+'..: live '+hb(M.lo[lo])+"
    "' .. '+hb(M.hi[lo])+(M.rhi?', reserved '+hb(M.rlo[lo])+' .. '+hb(M.rhi[lo]):'')};"
    ;
/* The script's second half (C99 guarantees string literals of 4095 bytes). */
static const char page_js_charts[] =
    /* lifetimes: heat map of the aggregated allocations, bars of the largest */
    "m=ctx('life');g=m[1];w=m[2];h=m[3];var H=D.heat,rows=H.rows,rh=h/Math.max(1,rows),cw=w/H.cols,"
    "vmax=1;for(i=0;i<H.v.length;i++)if(H.v[i]>vmax)vmax=H.v[i];var lv=Math.log(1+vmax);"
    "for(var r=0;r<rows;r++)for(var c=0;c<H.cols;c++){var v=H.v[r*H.cols+c];if(!v)continue;"
    "g.fillStyle='rgba(90,150,90,'+(0.12+0.8*Math.log(1+v)/lv).toFixed(3)+')';"
    "g.fillRect(L+c*cw,T+h-(r+1)*rh,Math.ceil(cw),Math.max(1,rh-1))}"
    "var Bs=D.bars;for(i=0;i<Bs.id.length;i++){var k=Math.floor(Math.log2(Bs.size[i]))-H.row0;"
    "var y=T+h-(k+1)*rh+((Bs.id[i]*2654435761>>>0)%997)/997*(rh-2),f=Bs.free[i]<0?D.events-1:Bs.free[i];"
    "g.fillStyle=Bs.peak[i]?'rgba(200,30,30,0.85)':'rgba(40,70,160,0.55)';"
    "g.fillRect(xs(Bs.alloc[i],w),y,Math.max(1,xs(f,w)-xs(Bs.alloc[i],w)),2)}"
    "g.strokeStyle='#999';g.beginPath();g.moveTo(L,T);g.lineTo(L,T+h);g.lineTo(L+w,T+h);g.stroke();"
    "g.fillStyle='#555';for(r=0;r<rows;r+=Math.max(1,Math.ceil(rows/10)))g.fillText(hb(Math.pow(2,"
    "H.row0+r)),2,T+h-r*rh-2);xaxis(g,w,h);steps(g,w,h,0);"
    "mark(g,D.peak_live_event,w,h,'#c00','peak');"
    /* stranded memory: an area with its top edge drawn (at 0 B too), on its own scale */
    "var S=D.stranded;if(S.ev.length){m=ctx('stranded');g=m[1];w=m[2];h=m[3];var sm=1048576;"
    "for(i=0;i<S.ev.length;i++)sm=Math.max(sm,S.s[i]);sm*=1.15;"
    "function yb(v){return T+h-v/sm*h}var lg=-1;for(i=0;i<S.ev.length;i++)if(S.g[i])lg=S.ev[i];"
    "if(lg>=0&&lg<D.events-1){x=xs(lg,w);g.fillStyle='#f2f2f2';g.fillRect(x,T,L+w-x,h);"
    "g.fillStyle='#777';g.fillText('after the last growth: costs no memory',Math.min(x+4,L+w-210),"
    "T+24)}axes(g,w,h,sm,hb);steps(g,w,h,0);"
    "g.beginPath();g.moveTo(L,yb(0));for(i=0;i<S.ev.length;i++){x=xs(S.ev[i],w);"
    "g.lineTo(x,yb(S.s[i]));"
    "g.lineTo(i+1<S.ev.length?xs(S.ev[i+1],w):x,yb(S.s[i]))}g.lineTo(x,yb(0));g.closePath();"
    "g.fillStyle='rgba(150,40,170,0.45)';g.fill();g.strokeStyle='rgb(150,40,170)';g.lineWidth=2;"
    "g.beginPath();for(i=0;i<S.ev.length;i++){x=xs(S.ev[i],w);var y=Math.min(yb(S.s[i]),T+h-1);"
    "if(i)g.lineTo(x,y);else g.moveTo(x,y);g.lineTo(i+1<S.ev.length?xs(S.ev[i+1],w):x,y)}"
    "g.stroke();g.lineWidth=1;"
    "g.fillStyle='#e07020';for(i=0;i<S.ev.length;i++)"
    "if(S.g[i])g.fillRect(xs(S.ev[i],w)-1,T+h-7,2,7);"
    "mark(g,D.peak_reserved_event,w,h,'#e07020','reserved peak: '+hb(S.at_peak)+' stranded')}"
    "var ms=performance.now()-t0;document.body.setAttribute('data-drawn-ms',ms.toFixed(1));"
    "document.body.setAttribute('data-load-ms',performance.now().toFixed(1));"
    "document.title='drawn: '+document.title})();";

static void card(FILE *f, const char *label, const char *value)
{
    fprintf(f, "<div class=card><span>%s</span><b>%s</b></div>", label, value);
}

stow_status_t stow__report_write_html(FILE *f, const stow_report_t *r, const stow_growth_t *g,
                                      const stow_html_opts_t *opts)
{
    const stow_trace_t *t = r->trace;
    size_t n = t->event_count;
    size_t max_points = opts && opts->max_points ? opts->max_points : 4000;
    size_t max_bars = opts && opts->max_bars ? opts->max_bars : 2000;
    size_t peak_rows = opts && opts->peak_rows ? opts->peak_rows : 100;
    stow_bucket_t *live_b = malloc(max_points * sizeof *live_b);
    stow_bucket_t *res_b = malloc(max_points * sizeof *res_b);
    stow_report_alloc_t *sorted = malloc((r->alloc_count ? r->alloc_count : 1) * sizeof *sorted);
    stow_report_alloc_t *peak = malloc(peak_rows * sizeof *peak);
    unsigned char *is_bar = calloc(r->alloc_count ? r->alloc_count : 1, 1);
    unsigned char *at_peak = calloc(r->alloc_count ? r->alloc_count : 1, 1);
    uint64_t *heat = calloc((size_t)STOW_REPORT_CLASSES * (HEAT_COLUMNS + 1), sizeof *heat);
    if (!live_b || !res_b || !sorted || !peak || !is_bar || !at_peak || !heat) {
        free(live_b), free(res_b), free(sorted), free(peak), free(is_bar), free(at_peak);
        free(heat);
        return STOW_EHOSTMEM;
    }
    size_t nb = stow__series_downsample(r->live_bytes, n, max_points, live_b);
    if (r->reserved_bytes)
        stow__series_downsample(r->reserved_bytes, n, max_points, res_b);
    size_t alive = n ? stow__report_alive_at(r, r->peak_live_event, peak, peak_rows) : 0;
    /* the allocations alive at the peak, for colouring bars */
    for (size_t id = 0; id < r->alloc_count; id++) {
        const stow_report_alloc_t *a = &r->allocs[id];
        at_peak[id] = n && a->alloc_event <= r->peak_live_event &&
                      (a->free_event == SIZE_MAX || a->free_event > r->peak_live_event);
    }
    size_t allocated = 0;
    for (size_t id = 0; id < r->alloc_count; id++)
        if (r->allocs[id].alloc_event != SIZE_MAX)
            sorted[allocated++] = r->allocs[id];
    qsort(sorted, allocated, sizeof *sorted, by_size_then_id);
    size_t bars = allocated < max_bars ? allocated : max_bars;
    for (size_t i = 0; i < bars; i++)
        is_bar[sorted[i].id] = 1;
    /* heat map of the rest: bytes alive at some point of each column, via a
     * difference array per size class */
    unsigned row_lo = STOW_REPORT_CLASSES, row_hi = 0;
    for (size_t id = 0; id < r->alloc_count; id++) {
        const stow_report_alloc_t *a = &r->allocs[id];
        if (a->alloc_event == SIZE_MAX)
            continue;
        unsigned k = stow__report_size_class(a->size_bytes);
        row_lo = k < row_lo ? k : row_lo;
        row_hi = k > row_hi ? k : row_hi;
        if (is_bar[id])
            continue;
        size_t last = a->free_event == SIZE_MAX ? n - 1 : a->free_event;
        size_t c0 = (size_t)((double)a->alloc_event * HEAT_COLUMNS / (double)n);
        size_t c1 = (size_t)((double)last * HEAT_COLUMNS / (double)n);
        heat[k * (HEAT_COLUMNS + 1) + c0] += a->size_bytes;
        heat[k * (HEAT_COLUMNS + 1) + c1 + 1] -= a->size_bytes;
    }
    if (row_lo > row_hi)
        row_lo = row_hi = 0;

    char buf[64], buf2[64];
    fputs("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\n<title>", f);
    const char *base = t->path ? strrchr(t->path, '/') : NULL;
    html_escape(f, base ? base + 1 : t->path ? t->path : "trace");
    fprintf(f, " - stowage report</title>\n<style>%s</style></head>\n<body>\n", page_css);
    fputs("<h1>Memory report: ", f);
    html_escape(f, t->path ? t->path : "trace");
    fprintf(f, "</h1><div>policy <b>%s</b>, %zu events, %u allocation ids, %u stream(s)</div>\n",
            r->policy, n, t->id_count, t->stream_count);
    fputs("<div class=cards>", f);
    human(buf, sizeof buf, r->peak_live_bytes);
    card(f, "peak live (lower bound)", buf);
    human(buf, sizeof buf, r->peak_reserved_bytes);
    card(f, "peak reserved", buf);
    snprintf(buf, sizeof buf, "%.4f",
             r->peak_live_bytes ? (double)r->peak_reserved_bytes / (double)r->peak_live_bytes
                                : 0.0);
    card(f, "reserved / live", buf);
    if (r->has_stranded) {
        human(buf, sizeof buf, r->stranded_at_peak_bytes);
        card(f, "stranded at the reserved peak", buf);
    }
    if (r->has_backend_calls) {
        snprintf(buf, sizeof buf, "%" PRIu64, r->backend_calls);
        card(f, "backend calls", buf);
    }
    snprintf(buf, sizeof buf, "%" PRIu64, r->ooms);
    card(f, "OOM errors", buf);
    if (r->has_min_capacity) {
        human(buf, sizeof buf, r->min_capacity_bytes);
        card(f, "minimum capacity", buf);
    }
    snprintf(buf, sizeof buf, "%zu", n ? r->peak_live_event : 0);
    card(f, "peak live at event", buf);
    fputs("</div>\n<p class=why>Peak live is the most bytes the program held at once, the least "
          "any allocator needs; peak reserved is the most the policy held from the device, so "
          "reserved / live is the price of the allocator: 1.0000 is the floor and lower is "
          "better.",
          f);
    if (r->has_stranded)
        fputs(" Stranded bytes are the part of the reserved peak that fragmentation made "
              "unusable (below): 0 B means fragmentation cost nothing.",
              f);
    fputs(" Backend calls are the policy's requests to the device (each one costs a "
          "synchronization or more on a GPU); OOM errors are allocations the policy refused.</p>\n",
          f);

    /* the x axis of every chart */
    bool markers = t->marker_count > 0;
    fputs("<p class=why>Every chart shares its x axis: the event index, each allocation or free "
          "of the trace one event, in order (a .rep trace has no times). ",
          f);
    if (markers)
        fprintf(f, "Grey lines mark the trace's %zu step markers (<code>m KEY</code> lines%s), "
                   "labelled with their key where there is room.</p>\n",
                t->marker_count, t->marker_count > MAX_MARKERS ? "; the first 4000 drawn" : "");
    else
        fputs("This trace has no step markers (<code>m KEY</code> lines, written by "
              "<code>stowage.torch.step</code> or <code>stow_pool_step</code>); they would be "
              "drawn as grey lines.</p>\n",
              f);

    fputs("<h2>Memory over time</h2><div class=legend><i style='background:rgba(60,110,200,.6)'>"
          "</i>live bytes (min..max per bucket)",
          f);
    if (r->reserved_bytes)
        fprintf(f, "<i style='background:#e07020'></i>reserved bytes (%s)", r->policy);
    else
        fprintf(f, " (reserved bytes over time are not observable for policy %s)", r->policy);
    fputs("<i style='background:#c00'></i>peak live", f);
    if (g && g->boundary_count)
        fputs("<i style='background:#080'></i>iteration boundaries", f);
    if (markers)
        fputs("<i style='background:#aaa'></i>step markers", f);
    fputs("</div><canvas id=mem width=1300 height=320></canvas><div id=tip></div>\n", f);
    fputs("<p class=why>Bytes against events: live bytes (blue) are what the program holds, "
          "reserved bytes (orange) what the policy holds from the device to serve it; the gap "
          "between them is memory held but not in use, and the smaller it is at the peak, the "
          "better (hover for a bucket's range).</p>\n",
          f);

    fputs("<h2>Allocation lifetimes</h2><div class=legend>y: request size (log scale); "
          "x: events.",
          f);
    fprintf(f,
            "<i style='background:rgba(200,30,30,.85)'></i>the %zu largest allocations, alive at"
            " the peak<i style='background:rgba(40,70,160,.55)'></i>not alive at the peak"
            "<i style='background:rgba(90,150,90,.6)'></i>the other %zu, aggregated: bytes alive"
            " per size class and time bucket</div>\n",
            bars, allocated - bars);
    fputs("<canvas id=life width=1300 height=300></canvas>\n", f);
    fputs("<p class=why>Each bar is one allocation, from its allocation to its free, at the "
          "height of its size: red bars make up the peak of live bytes, so freeing them earlier "
          "or making them smaller lowers it; the green shade sums the smaller allocations, the "
          "darker the more bytes alive in that size class then.</p>\n",
          f);

    if (r->frag_count) {
        fputs("<h2>Stranded memory</h2><div class=legend>"
              "<i style='background:rgb(150,40,170)'></i>stranded bytes: free, but in pieces no "
              "request from then on fits<i style='background:#e07020'></i>the pool grows to a "
              "new high (ticks); the reserved peak (dashed)<i style='background:#e4e4e4'></i>"
              "after the last growth</div>\n"
              "<canvas id=stranded width=1300 height=180></canvas>\n",
              f);
        human(buf, sizeof buf, r->stranded_at_peak_bytes);
        human(buf2, sizeof buf2, r->free_at_peak_bytes);
        char most[64];
        human(most, sizeof most, r->stranded_growth_max_bytes);
        fprintf(f,
                "<p class=why>Stranded bytes are free bytes in segments that still hold live "
                "blocks, in runs smaller than every request of their pool from that event on "
                "(small: at most 1 MiB; large: the rest), so the pool can neither hand them out "
                "nor give them back. They cost memory where the pool grows beside them (orange "
                "ticks): at the reserved peak they are the part of it lost to fragmentation, "
                "here %s of the %s then free (%s at most at a growth); high is bad, 0 B is "
                "ideal. After the last growth they cost nothing (near the end of a trace few "
                "requests remain, so free bytes strand easily). Sampled at %zu events, every "
                "growth included.</p>\n",
                buf, buf2, most, r->frag_count);
    } else if (r->reserved_bytes) {
        fputs("<h2>Stranded memory</h2><p class=why>Stranded bytes (free memory in pieces no "
              "request from then on fits) are computed for policy classic only: a page-mapped "
              "pool moves physical memory to where it is needed, and the models of other "
              "allocators expose no blocks. Run <code>--policy classic</code> for them.</p>\n",
              f);
    }

    if (g) {
        fputs("<h2>Growth across iterations</h2>", f);
        if (g->boundary_count == 0) {
            fputs("<div>No iteration boundaries found (no repeating pattern). Pass "
                  "<code>--iterations N</code> or <code>--boundary E,...</code>.</div>\n",
                  f);
        } else {
            if (g->leak)
                fprintf(f, "<div class=warn>Warning: live bytes grow at every iteration boundary,"
                           " by %" PRId64 " bytes per iteration on average: a leak?</div>",
                        g->growth_per_iteration_bytes);
            else if (g->boundary_count >= 3)
                fputs("<div class=ok>No steady growth of live bytes across iterations.</div>", f);
            else
                fputs("<div>Too few boundaries to judge growth (need 3).</div>", f);
            fprintf(f, "<table><tr><th>boundary</th><th>event</th><th>live bytes</th>"
                       "<th>change</th></tr>");
            for (unsigned i = 0; i < g->boundary_count; i++) {
                human(buf, sizeof buf, g->boundary_live[i]);
                fprintf(f, "<tr><td>%u</td><td>%zu</td><td>%s</td><td>%+" PRId64 "</td></tr>",
                        i + 1, g->boundary_event[i], buf,
                        i ? (int64_t)g->boundary_live[i] - (int64_t)g->boundary_live[i - 1] : 0);
            }
            fprintf(f, "</table><div class=legend>boundaries: %s</div>\n", g->method);
        }
        fputs("<p class=why>Live bytes at each iteration boundary (the lowest point near each "
              "repetition of the live-bytes pattern, or the boundaries given), change in bytes: "
              "a rise at every boundary is a leak, a flat column is healthy.</p>\n",
              f);
    }

    human(buf, sizeof buf, r->peak_live_bytes);
    fprintf(f, "<h2>Sources of the peak</h2><div>%zu allocations alive after event %zu "
               "(peak live %s); the %zu largest:</div>\n",
            alive, n ? r->peak_live_event : 0, buf, alive < peak_rows ? alive : peak_rows);
    fputs("<table id=peak><tr><th>#</th><th>id</th><th>size</th><th>bytes</th><th>share</th>"
          "<th>alloc event</th><th>free event</th><th>lifetime (events)</th>"
          "<th class=l>tag</th></tr>\n",
          f);
    for (size_t i = 0; i < alive && i < peak_rows; i++) {
        const stow_report_alloc_t *a = &peak[i];
        human(buf, sizeof buf, a->size_bytes);
        size_t end = a->free_event == SIZE_MAX ? n : a->free_event;
        fprintf(f, "<tr data-id=%u><td>%zu</td><td>%u</td><td>%s</td><td>%" PRIu64
                   "</td><td>%.1f%%</td><td>%zu</td>",
                a->id, i + 1, a->id, buf, a->size_bytes,
                r->peak_live_bytes ? 100.0 * (double)a->size_bytes / (double)r->peak_live_bytes
                                   : 0.0,
                a->alloc_event);
        if (a->free_event == SIZE_MAX)
            fputs("<td>never</td>", f);
        else
            fprintf(f, "<td>%zu</td>", a->free_event);
        fprintf(f, "<td>%zu</td><td class=l>", end - a->alloc_event);
        html_escape(f, r->tags && r->tags[a->id] ? r->tags[a->id] : "");
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    fprintf(f, "<p class=why>The allocations alive at the peak of live bytes, largest first, "
               "with their share of the peak: the bytes to cut to lower it. The tag says where "
               "an allocation was made (<code>TRACE.tags</code>: the user's line for a PyTorch "
               "snapshot or <code>stowage.record</code>, the thread's tag set with "
               "<code>stow_tag_set</code>)%s.</p>\n",
            r->tags ? "" : "; this trace has no tags file, so the column is empty");

    /* the data */
    fprintf(f, "<script id=data type=application/json>{\"events\":%zu,\"peak_live\":%" PRIu64
               ",\"peak_live_event\":%zu,\"peak_reserved\":%" PRIu64 ",\"mem\":{",
            n, r->peak_live_bytes, n ? r->peak_live_event : 0, r->peak_reserved_bytes);
    json_bucket_field(f, "ev", live_b, nb, 0);
    fputc(',', f);
    json_bucket_field(f, "lo", live_b, nb, 1);
    fputc(',', f);
    json_bucket_field(f, "hi", live_b, nb, 2);
    if (r->reserved_bytes) {
        fputc(',', f);
        json_bucket_field(f, "rlo", res_b, nb, 1);
        fputc(',', f);
        json_bucket_field(f, "rhi", res_b, nb, 2);
    }
    fputs("},\"stranded\":{\"ev\":[", f);
    for (size_t i = 0; i < r->frag_count; i++)
        fprintf(f, i ? ",%zu" : "%zu", r->frag_event[i]);
    fputs("],", f);
    json_u64s(f, "s", r->stranded_bytes, r->frag_count);
    fputc(',', f);
    json_u64s(f, "free", r->free_bytes, r->frag_count);
    fputs(",\"g\":[", f);
    for (size_t i = 0; i < r->frag_count; i++)
        fprintf(f, i ? ",%u" : "%u", (unsigned)r->stranded_growth[i]);
    fputc(']', f);
    fprintf(f, ",\"at_peak\":%" PRIu64 "},\"peak_reserved_event\":%zu,\"steps\":{\"ev\":[",
            r->stranded_at_peak_bytes,
            r->peak_reserved_event == SIZE_MAX ? (size_t)0 : r->peak_reserved_event);
    size_t shown_markers = t->marker_count < MAX_MARKERS ? t->marker_count : MAX_MARKERS;
    for (size_t i = 0; i < shown_markers; i++)
        fprintf(f, i ? ",%zu" : "%zu", t->markers[i].before_event);
    fputs("],\"key\":[", f);
    for (size_t i = 0; i < shown_markers; i++) {
        uint32_t k = t->markers[i].key;
        /* keys are [A-Za-z0-9_.:/-] (stowage/step_key.h): nothing to escape */
        fprintf(f, i ? ",\"%s\"" : "\"%s\"", k == STOW_TRACE_STEP_END ? "end" : t->keys[k]);
    }
    fputs("]},\"bars\":{\"id\":[", f);
    for (size_t i = 0; i < bars; i++)
        fprintf(f, i ? ",%u" : "%u", sorted[i].id);
    fputs("],\"size\":[", f);
    for (size_t i = 0; i < bars; i++)
        fprintf(f, i ? ",%" PRIu64 : "%" PRIu64, sorted[i].size_bytes);
    fputs("],\"alloc\":[", f);
    for (size_t i = 0; i < bars; i++)
        fprintf(f, i ? ",%zu" : "%zu", sorted[i].alloc_event);
    fputs("],\"free\":[", f);
    for (size_t i = 0; i < bars; i++) {
        if (i)
            fputc(',', f);
        if (sorted[i].free_event == SIZE_MAX)
            fputs("-1", f);
        else
            fprintf(f, "%zu", sorted[i].free_event);
    }
    fputs("],\"peak\":[", f);
    for (size_t i = 0; i < bars; i++)
        fprintf(f, i ? ",%u" : "%u", at_peak[sorted[i].id]);
    fprintf(f, "]},\"heat\":{\"cols\":%d,\"rows\":%u,\"row0\":%u,\"v\":[", HEAT_COLUMNS,
            row_hi - row_lo + 1, row_lo);
    for (unsigned k = row_lo; k <= row_hi; k++) {
        uint64_t run = 0;
        for (size_t c = 0; c < HEAT_COLUMNS; c++) {
            run += heat[k * (HEAT_COLUMNS + 1) + c];
            fprintf(f, k == row_lo && c == 0 ? "%" PRIu64 : ",%" PRIu64, run);
        }
    }
    fputs("]},\"growth\":{", f);
    unsigned gb = g ? g->boundary_count : 0;
    json_u64s(f, "live", g ? g->boundary_live : NULL, gb);
    fputs(",\"ev\":[", f);
    for (unsigned i = 0; i < gb; i++)
        fprintf(f, i ? ",%zu" : "%zu", g->boundary_event[i]);
    fprintf(f, "],\"leak\":%s}}</script>\n<script>%s%s</script>\n</body></html>\n",
            g && g->leak ? "true" : "false", page_js, page_js_charts);
    free(live_b), free(res_b), free(sorted), free(peak), free(is_bar), free(at_peak);
    free(heat);
    return ferror(f) ? STOW_EIO : STOW_OK;
}

void stow__report_write_json(FILE *f, const stow_report_t *r, const stow_growth_t *g)
{
    fputs("{\"trace\":\"", f);
    for (const char *s = r->trace->path ? r->trace->path : ""; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fprintf(f, "\",\"policy\":\"%s\",\"events\":%zu,\"peak_live_bytes\":%" PRIu64
               ",\"peak_live_event\":%zu,\"peak_reserved_bytes\":%" PRIu64 ",\"ooms\":%" PRIu64,
            r->policy, r->trace->event_count, r->peak_live_bytes, r->peak_live_event,
            r->peak_reserved_bytes, r->ooms);
    if (r->has_backend_calls)
        fprintf(f, ",\"backend_calls\":%" PRIu64, r->backend_calls);
    if (r->has_min_capacity)
        fprintf(f, ",\"min_capacity_bytes\":%" PRIu64, r->min_capacity_bytes);
    if (r->has_stranded)
        fprintf(f,
                ",\"stranded_at_peak_bytes\":%" PRIu64 ",\"stranded_at_growth_max_bytes\":%" PRIu64
                ",\"stranded_max_bytes\":%" PRIu64,
                r->stranded_at_peak_bytes, r->stranded_growth_max_bytes, r->stranded_max_bytes);
    if (g) {
        fprintf(f, ",\"iterations\":%u,\"boundaries\":\"%s\",\"boundary_live_bytes\":[",
                g->iterations, g->method);
        for (unsigned i = 0; i < g->boundary_count; i++)
            fprintf(f, i ? ",%" PRIu64 : "%" PRIu64, g->boundary_live[i]);
        fprintf(f, "],\"leak\":%s", g->leak ? "true" : "false");
    }
    fputs("}\n", f);
}
