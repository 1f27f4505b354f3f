/* Point-to-point and collectives with checked results, for the engine
 * tests: ping-pong, allreduce and alltoall at several sizes. Prints one
 * line per check and "mpi_check: ok" at the end; exits non-zero (through
 * MPI_Abort) on the first wrong byte. With "-l N" it also times N 8-byte
 * ping-pongs and prints "pingpong_8B_us <half round trip>". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long at, long got, long want)
{
	fprintf(stderr, "mpi_check: rank %d: %s: at %ld got %ld want %ld\n",
		rank, what, at, got, want);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

static unsigned char pattern(int from, long i, int round)
{
	return (unsigned char)(from * 131 + i * 7 + round * 17);
}

static void pingpong(long n, int rounds)
{
	unsigned char *buf;
	int peer = rank ^ 1;

	if (peer >= size || n < 0)
		return;
	buf = malloc(n ? n : 1);
	for (int r = 0; r < rounds; r++) {
		if (rank % 2 == 0) {
			for (long i = 0; i < n; i++)
				buf[i] = pattern(rank, i, r);
			MPI_Send(buf, n, MPI_BYTE, peer, r, MPI_COMM_WORLD);
			memset(buf, 0, (size_t)n);
			MPI_Recv(buf, n, MPI_BYTE, peer, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (long i = 0; i < n; i++)
				if (buf[i] != pattern(peer, i, r))
					fail("pingpong", i, buf[i], pattern(peer, i, r));
		} else {
			MPI_Recv(buf, n, MPI_BYTE, peer, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (long i = 0; i < n; i++)
				if (buf[i] != pattern(peer, i, r))
					fail("pingpong", i, buf[i], pattern(peer, i, r));
			for (long i = 0; i < n; i++)
				buf[i] = pattern(rank, i, r);
			MPI_Send(buf, n, MPI_BYTE, peer, r, MPI_COMM_WORLD);
		}
	}
	free(buf);
	if (rank == 0)
		printf("pingpong %ld B x %d: ok\n", n, rounds);
}

static void allreduce(long n)
{
	int64_t *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);

	for (long i = 0; i < n; i++)
		in[i] = (int64_t)(rank + 1) * (i + 1);
	MPI_Allreduce(in, out, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
	/* sum over ranks of (r+1)(i+1) = (i+1) * size(size+1)/2 */
	for (long i = 0; i < n; i++) {
		int64_t want = (int64_t)(i + 1) * size * (size + 1) / 2;
		if (out[i] != want)
			fail("allreduce", i, out[i], want);
	}
	free(in);
	free(out);
	if (rank == 0)
		printf("allreduce %ld x int64: ok\n", n);
}

static void alltoall(long n)
{
	unsigned char *s = malloc(n * size), *r = malloc(n * size);

	for (int to = 0; to < size; to++)
		for (long i = 0; i < n; i++)
			s[to * n + i] = pattern(rank, i, to);
	MPI_Alltoall(s, n, MPI_BYTE, r, n, MPI_BYTE, MPI_COMM_WORLD);
	for (int from = 0; from < size; from++)
		for (long i = 0; i < n; i++)
			if (r[from * n + i] != pattern(from, i, rank))
				fail("alltoall", from * n + i, r[from * n + i],
				     pattern(from, i, rank));
	free(s);
	free(r);
	if (rank == 0)
		printf("alltoall %ld B per rank: ok\n", n);
}

int main(int argc, char **argv)
{
	long lat_iters = 0;
	const long sizes[] = { 1, 8, 4096, 65536, 1 << 20 };

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-l"))
			lat_iters = atol(argv[i + 1]);
	for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++)
		pingpong(sizes[k], sizes[k] > 65536 ? 4 : 20);
	for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		allreduce(sizes[k] / 8 ? sizes[k] / 8 : 1);
		alltoall(sizes[k] > 65536 ? 65536 : sizes[k]);
	}
	if (lat_iters > 0 && size >= 2) {
		char b[8] = { 0 };
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long i = 0; i < lat_iters; i++) {
			if (rank == 0) {
				MPI_Send(b, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(b, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else if (rank == 1) {
				MPI_Recv(b, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(b, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
			}
		}
		double t = MPI_Wtime() - t0;
		if (rank == 0)
			printf("pingpong_8B_us %.3f\n", t / lat_iters / 2 * 1e6);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: ok\n");
	MPI_Finalize();
	return 0;
}
