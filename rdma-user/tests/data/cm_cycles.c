/* Connect/disconnect cycles over rdma_cm with synchronous ids
 * (rdma_create_ep, rdma_get_request): every cycle makes an id, a QP and a
 * connection and destroys them. The client's odd cycles take the other
 * common path instead: rdma_create_id, rdma_resolve_addr and _route,
 * rdma_create_qp without CQs (rdma_cm makes two, each with a completion
 * channel, i.e. a descriptor), rdma_destroy_qp (which frees them) and
 * rdma_destroy_id. Prints the process's open descriptors
 * after the first cycles and at the end, so that a leak shows; a leaked
 * QP shows too, as the device's QP limit (1024) stops a run of more
 * cycles than that.
 *
 * The client also times each connection's setup (rdma_create_ep, which
 * resolves the address and route, through rdma_connect's return, i.e. the
 * REP received and the RTU sent) and prints its percentiles: cmtime keeps
 * all connections in flight at once and prints only min, max and total.
 *
 * usage: cm_cycles server ADDR PORT N | cm_cycles client ADDR PORT N
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = -1; /* the DIR's own descriptor */

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The value below which a fraction q of the sorted samples lie
 * (nearest rank). */
static double pct(const double *v, int n, double q)
{
	int k = (int)(q * n + 0.999999) - 1;

	if (k < 0)
		k = 0;
	if (k >= n)
		k = n - 1;
	return v[k];
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* QP attributes without CQs: rdma_create_qp writes the CQs it made back
 * into them, so every QP gets a fresh copy. */
static void init_attr(struct ibv_qp_init_attr *attr)
{
	memset(attr, 0, sizeof *attr);
	attr->qp_type = IBV_QPT_RC;
	attr->cap.max_send_wr = attr->cap.max_recv_wr = 1;
	attr->cap.max_send_sge = attr->cap.max_recv_sge = 1;
	attr->sq_sig_all = 1;
}

/* The client's odd cycles: an id and its QP step by step. */
static int by_id(struct rdma_cm_id **id, struct rdma_addrinfo *res,
		 struct ibv_qp_init_attr *attr, int cycle)
{
	const char *step = "rdma_create_id";

	if (rdma_create_id(NULL, id, NULL, RDMA_PS_TCP))
		goto fail;
	step = "rdma_resolve_addr";
	if (rdma_resolve_addr(*id, res->ai_src_addr, res->ai_dst_addr, 2000))
		goto fail;
	step = "rdma_resolve_route";
	if (rdma_resolve_route(*id, 2000))
		goto fail;
	step = "rdma_create_qp";
	init_attr(attr);
	if (rdma_create_qp(*id, NULL, attr))
		goto fail;
	return 0;
fail:
	fprintf(stderr, "cycle %d: ", cycle);
	perror(step);
	return 1;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id = NULL, *id;
	int server, n, i, fds_early = -1;
	double t0, t, total, *setup;

	if (argc != 5) {
		fprintf(stderr, "usage: %s server|client ADDR PORT N\n", argv[0]);
		return 2;
	}
	server = !strcmp(argv[1], "server");
	n = atoi(argv[4]);
	if (n < 1) {
		fprintf(stderr, "N must be at least 1\n");
		return 2;
	}
	setup = calloc(n, sizeof *setup);
	if (!setup) {
		perror("calloc");
		return 1;
	}

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) {
		perror("rdma_getaddrinfo");
		return 1;
	}
	init_attr(&attr);

	if (server) {
		if (rdma_create_ep(&listen_id, res, NULL, &attr)) {
			perror("rdma_create_ep (listen)");
			return 1;
		}
		if (rdma_listen(listen_id, 16)) {
			perror("rdma_listen");
			return 1;
		}
		printf("listening\n");
		fflush(stdout);
	}
	t0 = now();
	for (i = 0; i < n; i++) {
		if (server) {
			if (rdma_get_request(listen_id, &id)) {
				perror("rdma_get_request");
				return 1;
			}
			if (rdma_accept(id, NULL)) {
				perror("rdma_accept");
				return 1;
			}
		} else {
			t = now();
			if (i % 2) {
				if (by_id(&id, res, &attr, i))
					return 1;
			} else {
				init_attr(&attr);
				if (rdma_create_ep(&id, res, NULL, &attr)) {
					fprintf(stderr, "cycle %d: ", i);
					perror("rdma_create_ep");
					return 1;
				}
			}
			if (rdma_connect(id, NULL)) {
				fprintf(stderr, "cycle %d: ", i);
				perror("rdma_connect");
				return 1;
			}
			setup[i] = (now() - t) * 1e6;
		}
		rdma_disconnect(id);
		if (!server && i % 2) {
			rdma_destroy_qp(id);
			rdma_destroy_id(id);
		} else {
			rdma_destroy_ep(id);
		}
		if (i == 9)
			fds_early = open_fds();
	}
	total = now() - t0;
	printf("cycles %d in %.2f s, descriptors after 10 %d, at the end %d\n",
	       n, total, fds_early, open_fds());
	if (!server) {
		qsort(setup, n, sizeof *setup, cmp_double);
		printf("setup_us p50 %.0f p99 %.0f max %.0f cycles_per_s %.1f\n",
		       pct(setup, n, 0.50), pct(setup, n, 0.99), setup[n - 1],
		       n / total);
	}
	if (listen_id)
		rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	free(setup);
	return 0;
}
