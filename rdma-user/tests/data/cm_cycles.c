/* Connect/disconnect cycles over rdma_cm with synchronous ids
 * (rdma_create_ep, rdma_get_request): every cycle makes an id, a QP and a
 * connection and destroys them. Prints the process's open descriptors
 * after the first cycles and at the end, so that a leak shows; a leaked
 * QP shows too, as the device's QP limit (1024) stops a run of more
 * cycles than that.
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

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id = NULL, *id;
	int server, n, i, fds_early = -1;
	double t0;

	if (argc != 5) {
		fprintf(stderr, "usage: %s server|client ADDR PORT N\n", argv[0]);
		return 2;
	}
	server = !strcmp(argv[1], "server");
	n = atoi(argv[4]);

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) {
		perror("rdma_getaddrinfo");
		return 1;
	}
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;

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
			if (rdma_create_ep(&id, res, NULL, &attr)) {
				fprintf(stderr, "cycle %d: ", i);
				perror("rdma_create_ep");
				return 1;
			}
			if (rdma_connect(id, NULL)) {
				fprintf(stderr, "cycle %d: ", i);
				perror("rdma_connect");
				return 1;
			}
		}
		rdma_disconnect(id);
		rdma_destroy_ep(id);
		if (i == 9)
			fds_early = open_fds();
	}
	printf("cycles %d in %.2f s, descriptors after 10 %d, at the end %d\n",
	       n, now() - t0, fds_early, open_fds());
	if (listen_id)
		rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return 0;
}
