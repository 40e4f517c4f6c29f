/*
 * mpi_allreduce.c: the peer all-reduce that scripts/bench allreduce compares the
 * switch with. Every rank fills a float32 tensor, runs one warm-up
 * MPI_Allreduce (MPI_FLOAT, MPI_SUM, in place), then K timed ones, each
 * between two barriers and timed with MPI_Wtime. An all-reduce's time is the
 * slowest rank's (MPI_MAX over ranks). Rank 0 prints one JSON object:
 *
 *   {"ranks":4,"elements":16777216,"bytes":67108864,"iterations":5,
 *    "best_s":...,"median_s":...,"mean_s":...,"worst_s":...,
 *    "times_s":[...],"machine_busy_cpu_s":...,"workers_cpu_s":...,"verified":true}
 *
 * "machine_busy_cpu_s" is the whole machine's busy CPU time (every CPU,
 * kernel and softirq included, from /proc/stat) summed over the timed
 * all-reduces only: rank 0 reads it after the barrier that starts each one
 * and after the MPI_MAX that ends it. The ranks of the benchmark share one
 * machine, so it is every rank's cost, start-up and the fill excluded.
 *
 * "workers_cpu_s" is the ranks' own CPU time (getrusage: user + system),
 * summed over ranks, over the same all-reduces: what the training hosts
 * would pay, the switch and other processes excluded.
 *
 * "verified" checks a few elements of the last result against the exact sum
 * (the fill is small integers, so float32 sums are exact in any order).
 *
 * Usage: mpi_allreduce ELEMENTS ITERATIONS
 * Build: mpicc -O2 -o mpi_allreduce bench/mpi_allreduce.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* process_cpu_s: this rank's own CPU seconds so far (user + system of
 * every thread: getrusage). */
static double process_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0.0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* machine_busy_cpu_s: the machine's busy CPU seconds since boot: user,
 * nice, system, irq, softirq and steal of /proc/stat's "cpu" line, in
 * USER_HZ ticks (100 a second for user space); -1 if unreadable. */
static double machine_busy_cpu_s(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return -1.0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8)
        return -1.0;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / 100.0;
}

/* fill: a small integer pattern from (rank, index), so sums are exact. */
static float fill(int rank, long i)
{
    return (float)((rank + 1) * ((i % 7) + 1));
}

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    if (argc != 3) {
        if (rank == 0)
            fprintf(stderr, "usage: %s ELEMENTS ITERATIONS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *end = NULL;
    long elements = strtol(argv[1], &end, 10);
    if (*end != '\0' || elements <= 0 || elements > (1L << 30))
        MPI_Abort(MPI_COMM_WORLD, 2);
    long iterations = strtol(argv[2], &end, 10);
    if (*end != '\0' || iterations <= 0 || iterations > 100000)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (elements > 0x7fffffffL)
        MPI_Abort(MPI_COMM_WORLD, 2);

    float *buf = malloc((size_t)elements * sizeof(float));
    double *times = malloc((size_t)iterations * sizeof(double));
    if (buf == NULL || times == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* Warm-up: connections are made on first use. */
    for (long i = 0; i < elements; i++)
        buf[i] = fill(rank, i);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)elements, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    double busy = 0.0, own = 0.0;
    for (long it = 0; it < iterations; it++) {
        for (long i = 0; i < elements; i++)
            buf[i] = fill(rank, i);
        MPI_Barrier(MPI_COMM_WORLD);
        double busy0 = rank == 0 ? machine_busy_cpu_s() : 0.0;
        double own0 = process_cpu_s();
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)elements, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double local = MPI_Wtime() - t0, slowest = 0.0;
        own += process_cpu_s() - own0;
        MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times[it] = slowest;
        if (rank == 0)
            busy += machine_busy_cpu_s() - busy0;
    }

    /* Check some elements: sum over ranks r of (r+1)*k = k*n(n+1)/2. */
    int ok = 1;
    for (long i = 0; i < elements; i += 1 + elements / 1024) {
        float want = (float)(((i % 7) + 1) * (long)size * (size + 1) / 2);
        if (buf[i] != want) {
            ok = 0;
            break;
        }
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    /* The ranks' own CPU over the timed all-reduces, summed. */
    double workers = 0.0;
    MPI_Reduce(&own, &workers, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        double *sorted = malloc((size_t)iterations * sizeof(double));
        if (sorted == NULL)
            MPI_Abort(MPI_COMM_WORLD, 1);
        memcpy(sorted, times, (size_t)iterations * sizeof(double));
        qsort(sorted, (size_t)iterations, sizeof(double), cmp_double);
        double median = (iterations % 2)
            ? sorted[iterations / 2]
            : (sorted[iterations / 2 - 1] + sorted[iterations / 2]) / 2.0;
        double sum = 0.0;
        for (long i = 0; i < iterations; i++)
            sum += times[i];
        printf("{\"ranks\":%d,\"elements\":%ld,\"bytes\":%ld,\"iterations\":%ld,"
               "\"best_s\":%.6f,\"median_s\":%.6f,\"mean_s\":%.6f,\"worst_s\":%.6f,"
               "\"times_s\":[",
               size, elements, elements * 4L, iterations, sorted[0], median,
               sum / (double)iterations, sorted[iterations - 1]);
        for (long i = 0; i < iterations; i++)
            printf("%s%.6f", i ? "," : "", times[i]);
        printf("],\"machine_busy_cpu_s\":%.2f,\"workers_cpu_s\":%.3f,\"verified\":%s}\n",
               busy, workers, all_ok ? "true" : "false");
        fflush(stdout);
        free(sorted);
    }
    free(times);
    free(buf);
    MPI_Finalize();
    return all_ok ? 0 : 3;
}
