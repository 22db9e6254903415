/*
 * blogbench-style load (an equivalent of Blogbench from the HAMMER SMP seed,
 * which Debian does not ship). Threads, all on one directory tree:
 *   writers     create new "blogs": a directory holding an article of
 *               1-64 KiB and 1-5 pictures of 4-200 KiB; once MAX_BLOGS exist,
 *               a writer recycles the oldest slot (deletes that blog, then
 *               creates it anew), so the disk use stays bounded
 *   rewriters   replace the article of a random blog: write a new file, then
 *               rename it over the article
 *   commenters  append a 1-4 KiB comment to the article of a random blog
 *   readers     read a whole random file (article or picture) of a random blog
 * Every written byte comes from a per-thread PRNG (no dedup/compression help).
 * With WRITE_RATE > 0 the writing threads together write at most that many
 * files per second (each file write waits for its turn on one shared clock),
 * so that targets are compared at equal write load: the readers' score then
 * says how well each serves reads beside the same writes.
 * An open that finds no file (ENOENT/ESTALE: a path-based FUSE server such as
 * bindfs can fail to open a name whose cached dentry still points at the file
 * a rename just replaced) is counted, printed at the end, and not scored.
 * Runs ITERATIONS iterations of SECONDS each and prints, per iteration,
 *   iteration N reads R writes W
 * where R counts whole files read and W counts files written, rewritten and
 * appended to during that iteration (followed by those three counts).
 *
 * Usage: blogbench DIR [writers rewriters commenters readers iterations seconds max_blogs
 *                       write_rate]
 * Build: cc -O2 -pthread -o blogbench blogbench.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_PICS 5
#define BUF_MAX (200 * 1024)

struct blog {
    pthread_rwlock_t lock; /* writers hold it exclusively while (re)creating */
    int valid;             /* a complete blog is on disk */
    int npics;
};

static const char *root;
static struct blog *blogs;
static long max_blogs;
static long next_slot;  /* slots handed out to writers so far (atomic) */
static long published;  /* slots that hold a complete blog at least once (atomic) */
static long reads, writes; /* per-iteration counters (atomic) */
static volatile int stop;

static void fatal(const char *what, const char *path)
{
    fprintf(stderr, "blogbench: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static long rnd(uint64_t *s, long lo, long hi) /* in [lo, hi] */
{
    return lo + (long)(xorshift(s) % (uint64_t)(hi - lo + 1));
}

static void fill(uint64_t *s, char *buf, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = xorshift(s);
        memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Opens that found no file: a path-based FUSE server (bindfs) can fail an open
 * of a name whose dentry the kernel still holds for the file that a rename
 * just replaced. Counted and printed, not fatal. */
static long misses;

static int miss(void)
{
    if (errno != ENOENT && errno != ESTALE)
        return 0;
    __atomic_fetch_add(&misses, 1, __ATOMIC_RELAXED);
    return 1;
}

/* The write pacing: files per second (0: unpaced), the clock's start, and
 * the file writes handed a turn so far (atomic). */
static long write_rate;
static struct timespec pace_start;
static long paced;

/* Waits for this file write's turn: the Nth write of the run starts no
 * earlier than N / write_rate seconds after the start. A target that falls
 * behind is not held back further (a cap, not a schedule to catch up). */
static void pace(void)
{
    if (write_rate <= 0)
        return;
    long n = __atomic_fetch_add(&paced, 1, __ATOMIC_RELAXED);
    long long ns = (long long)pace_start.tv_nsec + n * 1000000000LL / write_rate;
    struct timespec at = {pace_start.tv_sec + (time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
        ;
}

/* 0 when written, -1 when the file was missing (without O_CREAT) */
static int write_file(const char *path, int flags, uint64_t *s, char *buf, size_t n)
{
    pace();
    int fd = open(path, O_WRONLY | flags, 0644);
    if (fd < 0 && !(flags & O_CREAT) && miss())
        return -1;
    if (fd < 0)
        fatal("open", path);
    fill(s, buf, n);
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0)
            fatal("write", path);
        off += (size_t)w;
    }
    if (close(fd) < 0)
        fatal("close", path);
    return 0;
}

/* the writes, split by kind: new blog files, rewrites, appends */
static long wrote_new, wrote_rewrite, wrote_append;

static void count(long *c, long n) { __atomic_fetch_add(c, n, __ATOMIC_RELAXED); }

/* A random published blog, read-locked (or -1 when none could be taken). */
static long pick(uint64_t *s)
{
    long n = __atomic_load_n(&published, __ATOMIC_ACQUIRE);
    for (int tries = 0; n > 0 && tries < 8; tries++) {
        long b = rnd(s, 0, n - 1);
        if (pthread_rwlock_tryrdlock(&blogs[b].lock) == 0) {
            if (blogs[b].valid)
                return b;
            pthread_rwlock_unlock(&blogs[b].lock);
        }
    }
    return -1;
}

static void idle(void) { usleep(1000); }

static void create_blog(uint64_t *s, char *buf)
{
    long slot = __atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED);
    long b = slot % max_blogs;
    struct blog *bl = &blogs[b];
    char dir[4096], path[4400];
    snprintf(dir, sizeof dir, "%s/blog-%ld", root, b);
    pthread_rwlock_wrlock(&bl->lock);
    if (bl->valid) { /* recycle: delete the old blog */
        DIR *d = opendir(dir);
        struct dirent *e;
        if (!d)
            fatal("opendir", dir);
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) < 0)
                fatal("unlink", path);
        }
        closedir(d);
        if (rmdir(dir) < 0)
            fatal("rmdir", dir);
        bl->valid = 0;
    }
    if (mkdir(dir, 0755) < 0)
        fatal("mkdir", dir);
    snprintf(path, sizeof path, "%s/article", dir);
    write_file(path, O_CREAT | O_TRUNC, s, buf, (size_t)rnd(s, 1, 64) * 1024);
    count(&writes, 1);
    count(&wrote_new, 1);
    bl->npics = (int)rnd(s, 1, MAX_PICS);
    for (int i = 0; i < bl->npics; i++) {
        snprintf(path, sizeof path, "%s/picture-%d", dir, i);
        write_file(path, O_CREAT | O_TRUNC, s, buf, (size_t)rnd(s, 4, 200) * 1024);
        count(&writes, 1);
        count(&wrote_new, 1);
    }
    bl->valid = 1;
    pthread_rwlock_unlock(&bl->lock);
    if (slot < max_blogs) { /* publish slots in order */
        while (__atomic_load_n(&published, __ATOMIC_ACQUIRE) != slot && !stop)
            sched_yield();
        __atomic_store_n(&published, slot + 1, __ATOMIC_RELEASE);
    }
}

struct worker {
    pthread_t th;
    char kind;
    int id;
};

static void *run(void *arg)
{
    struct worker *w = arg;
    uint64_t s = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->id + 1) ^ (uint64_t)w->kind;
    char *buf = malloc(BUF_MAX + 8);
    char path[4200], tmp[4200];
    if (!buf)
        return NULL;
    while (!stop) {
        long b;
        switch (w->kind) {
        case 'w':
            create_blog(&s, buf);
            break;
        case 'r': /* rewrite the article: new file renamed over it */
            if ((b = pick(&s)) < 0) { idle(); break; }
            snprintf(tmp, sizeof tmp, "%s/blog-%ld/article.new-%d", root, b, w->id);
            snprintf(path, sizeof path, "%s/blog-%ld/article", root, b);
            write_file(tmp, O_CREAT | O_TRUNC, &s, buf, (size_t)rnd(&s, 1, 64) * 1024);
            if (rename(tmp, path) < 0)
                fatal("rename", tmp);
            count(&writes, 1);
            count(&wrote_rewrite, 1);
            pthread_rwlock_unlock(&blogs[b].lock);
            break;
        case 'c': /* append a comment */
            if ((b = pick(&s)) < 0) { idle(); break; }
            snprintf(path, sizeof path, "%s/blog-%ld/article", root, b);
            if (write_file(path, O_APPEND, &s, buf, (size_t)rnd(&s, 1, 4) * 1024) == 0) {
                count(&writes, 1);
                count(&wrote_append, 1);
            }
            pthread_rwlock_unlock(&blogs[b].lock);
            break;
        default: { /* read a whole file */
            int fd, k;
            ssize_t r;
            if ((b = pick(&s)) < 0) { idle(); break; }
            k = (int)rnd(&s, 0, blogs[b].npics); /* npics: the article */
            if (k == blogs[b].npics)
                snprintf(path, sizeof path, "%s/blog-%ld/article", root, b);
            else
                snprintf(path, sizeof path, "%s/blog-%ld/picture-%d", root, b, k);
            if ((fd = open(path, O_RDONLY)) < 0) {
                if (!miss())
                    fatal("open", path);
                pthread_rwlock_unlock(&blogs[b].lock);
                break;
            }
            while ((r = read(fd, buf, BUF_MAX)) > 0)
                ;
            if (r < 0)
                fatal("read", path);
            close(fd);
            count(&reads, 1);
            pthread_rwlock_unlock(&blogs[b].lock);
        }
        }
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    long nw = 3, nr = 1, nc = 2, nread = 8, iters = 5, secs = 6;
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [writers rewriters commenters readers iterations seconds max_blogs write_rate]\n", argv[0]);
        return 2;
    }
    root = argv[1];
    max_blogs = 2000;
    if (argc > 2) nw = atol(argv[2]);
    if (argc > 3) nr = atol(argv[3]);
    if (argc > 4) nc = atol(argv[4]);
    if (argc > 5) nread = atol(argv[5]);
    if (argc > 6) iters = atol(argv[6]);
    if (argc > 7) secs = atol(argv[7]);
    if (argc > 8) max_blogs = atol(argv[8]);
    if (argc > 9) write_rate = atol(argv[9]);
    if (max_blogs < 1 || write_rate < 0 || nw + nr + nc + nread < 1 || iters < 1 || secs < 1) {
        fprintf(stderr, "blogbench: bad arguments\n");
        return 2;
    }
    blogs = calloc((size_t)max_blogs, sizeof *blogs);
    for (long i = 0; i < max_blogs; i++)
        pthread_rwlock_init(&blogs[i].lock, NULL);

    /* a few blogs before the clock starts, so readers have something */
    uint64_t s = 42;
    char *buf = malloc(BUF_MAX + 8);
    for (long i = 0; i < 4 * (nw > 0 ? nw : 1) && i < max_blogs; i++)
        create_blog(&s, buf);
    reads = writes = wrote_new = wrote_rewrite = wrote_append = paced = 0;
    clock_gettime(CLOCK_MONOTONIC, &pace_start);

    long total = nw + nr + nc + nread, n = 0;
    struct worker *ws = calloc((size_t)total, sizeof *ws);
    const char kinds[] = {'w', 'r', 'c', 'R'};
    const long counts[] = {nw, nr, nc, nread};
    for (int k = 0; k < 4; k++)
        for (long i = 0; i < counts[k]; i++, n++) {
            ws[n].kind = kinds[k];
            ws[n].id = (int)n;
            if (pthread_create(&ws[n].th, NULL, run, &ws[n]) != 0) {
                fprintf(stderr, "blogbench: pthread_create failed\n");
                return 1;
            }
        }
    printf("blogbench: %ld writers, %ld rewriters, %ld commenters, %ld readers, "
           "%ld x %ld s, at most %ld blogs, %s%ld file writes/s\n", nw, nr, nc, nread, iters,
           secs, max_blogs, write_rate ? "at most " : "unpaced: ", write_rate);
    fflush(stdout);
    for (long it = 1; it <= iters; it++) {
        struct timespec ts = {secs, 0};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        long r = __atomic_exchange_n(&reads, 0, __ATOMIC_RELAXED);
        long w = __atomic_exchange_n(&writes, 0, __ATOMIC_RELAXED);
        long wn = __atomic_exchange_n(&wrote_new, 0, __ATOMIC_RELAXED);
        long wr = __atomic_exchange_n(&wrote_rewrite, 0, __ATOMIC_RELAXED);
        long wa = __atomic_exchange_n(&wrote_append, 0, __ATOMIC_RELAXED);
        printf("iteration %ld reads %ld writes %ld (new %ld rewritten %ld appended %ld)\n", it,
               r, w, wn, wr, wa);
        fflush(stdout);
    }
    stop = 1;
    for (long i = 0; i < total; i++)
        pthread_join(ws[i].th, NULL);
    printf("blogs created %ld, opens that found no file %ld\n", next_slot, misses);
    return 0;
}
