/* Bad use of the verbs API, against the drop-in libibverbs: every call
 * must return what rdma-core returns (NULL with errno, or an errno), and
 * nothing may crash or hang. Built by tests/ibverbs_abi.rs with Debian's
 * libibverbs-dev headers and run with LD_LIBRARY_PATH on our library.
 *
 * usage: misuse DEVICE PEER_IPV4   (the peer exists but runs no RDMA: it
 * never answers, so sends stay outstanding and finally retry out)
 *
 * Prints "ok NAME" per check, "FAIL NAME ..." and exits 1 on the first
 * that fails. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int failed;

#include "check.h"

static void on_alarm(int sig)
{
	(void)sig;
}

/* Interrupts the next blocking call in 100 ms (no SA_RESTART). */
static void alarm_soon(void)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = { .it_value = { .tv_usec = 100000 } };
	setitimer(ITIMER_REAL, &it, NULL);
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, int send, int recv)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = send, .max_recv_wr = recv, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR -> RTS towards a QP of the silent peer, with a short timeout
 * and one retry so that RETRY_EXC_ERR comes quickly. */
static int to_rts(struct ibv_qp *qp, const char *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				 .dest_qp_num = 0x11, .rq_psn = 1, .max_dest_rd_atomic = 1,
				 .min_rnr_timer = 12 };
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	memset(a.ah_attr.grh.dgid.raw, 0, 16);
	a.ah_attr.grh.dgid.raw[10] = 0xff;
	a.ah_attr.grh.dgid.raw[11] = 0xff;
	inet_pton(AF_INET, peer, &a.ah_attr.grh.dgid.raw[12]);
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	struct ibv_qp_attr b = { .qp_state = IBV_QPS_RTS, .timeout = 8, .retry_cnt = 1,
				 .rnr_retry = 1, .sq_psn = 1, .max_rd_atomic = 1 };
	return ibv_modify_qp(qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Polls until a completion arrives or 20 s pass. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	time_t end = time(NULL) + 20;
	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: misuse DEVICE PEER_IPV4\n");
		return 2;
	}
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_device *dev = NULL;
	for (int i = 0; i < num; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	CHECK("device", dev != NULL, "no device %s", argv[1]);
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK("open", ctx != NULL, "errno %d", errno);

	/* A destroyed or foreign object. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK("alloc_pd", pd != NULL, "errno %d", errno);
	struct ibv_pd *gone = ibv_alloc_pd(ctx);
	CHECK("dealloc_pd", ibv_dealloc_pd(gone) == 0, "");
	CHECK("dealloc_pd twice is EINVAL", ibv_dealloc_pd(gone) == EINVAL, "");
	char buf[4096], other[64];
	errno = 0;
	CHECK("reg_mr on a freed PD is NULL/EINVAL", !ibv_reg_mr(gone, buf, sizeof buf, 0) && errno == EINVAL,
	      "errno %d", errno);
	struct ibv_pd foreign = { .context = ctx };
	CHECK("dealloc_pd of a foreign PD is EINVAL", ibv_dealloc_pd(&foreign) == EINVAL, "");
	errno = 0;
	CHECK("reg_mr with remote write but no local write is EINVAL",
	      !ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL, "errno %d", errno);

	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK("reg_mr", mr != NULL, "errno %d", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK("create_cq", cq != NULL, "errno %d", errno);
	errno = 0;
	CHECK("create_cq with 0 entries is NULL/EINVAL", !ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL,
	      "errno %d", errno);
	struct ibv_qp *qp = rc_qp(pd, cq, 2, 4);
	CHECK("create_qp", qp != NULL, "errno %d", errno);
	CHECK("destroy_cq in use is EBUSY", ibv_destroy_cq(cq) == EBUSY, "");
	struct ibv_qp foreign_qp = { .context = ctx };
	CHECK("destroy_qp of a foreign QP is EINVAL", ibv_destroy_qp(&foreign_qp) == EINVAL, "");

	/* A QP in the wrong state. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	CHECK("post_send in RESET is EINVAL", ibv_post_send(qp, &swr, &bad) == EINVAL && bad == &swr, "");
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *rbad = NULL;
	CHECK("post_recv in RESET is EINVAL", ibv_post_recv(qp, &rwr, &rbad) == EINVAL, "");
	struct ibv_qp_attr rts = { .qp_state = IBV_QPS_RTS };
	CHECK("RESET -> RTS is EINVAL", ibv_modify_qp(qp, &rts, IBV_QP_STATE) == EINVAL, "");
	CHECK("RESET -> INIT", to_init(qp) == 0, "");
	CHECK("qp->state follows", qp->state == IBV_QPS_INIT, "state %d", qp->state);
	CHECK("post_send in INIT is EINVAL", ibv_post_send(qp, &swr, &bad) == EINVAL, "");

	/* WRs beyond the queue depth. */
	for (int i = 0; i < 4; i++)
		CHECK("post_recv within depth", ibv_post_recv(qp, &rwr, &rbad) == 0, "at %d", i);
	CHECK("post_recv beyond depth is ENOMEM", ibv_post_recv(qp, &rwr, &rbad) == ENOMEM, "");
	CHECK("INIT -> RTR -> RTS", to_rts(qp, argv[2]) == 0, "errno %d", errno);
	CHECK("post_send", ibv_post_send(qp, &swr, &bad) == 0, "");
	swr.wr_id = 3;
	CHECK("post_send", ibv_post_send(qp, &swr, &bad) == 0, "");
	CHECK("post_send beyond depth is ENOMEM", ibv_post_send(qp, &swr, &bad) == ENOMEM, "");

	/* Nobody answers: the sends retry out, then everything flushes. */
	struct ibv_wc wc;
	CHECK("a completion arrives", wait_wc(cq, &wc) == 1, "none in 20 s");
	CHECK("RETRY_EXC_ERR", wc.status == IBV_WC_RETRY_EXC_ERR && wc.wr_id == 1, "status %d (%s) wr_id %llu",
	      wc.status, ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
	int flushed = 0;
	while (wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_WR_FLUSH_ERR)
		if (++flushed == 5)
			break;
	CHECK("the rest flushes (1 send, 4 receives)", flushed == 5, "%d flushed, last status %d", flushed,
	      wc.status);
	CHECK("destroy_qp", ibv_destroy_qp(qp) == 0, "");

	/* An SGE outside its MR: a local protection error, nothing written. */
	qp = rc_qp(pd, cq, 4, 4);
	CHECK("create_qp", qp != NULL && to_init(qp) == 0 && to_rts(qp, argv[2]) == 0, "");
	struct ibv_sge out = { .addr = (uintptr_t)buf + 4000, .length = 200, .lkey = mr->lkey };
	struct ibv_send_wr owr = { .wr_id = 7, .sg_list = &out, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED };
	CHECK("post_send with an SGE past the MR", ibv_post_send(qp, &owr, &bad) == 0, "");
	CHECK("it completes", wait_wc(cq, &wc) == 1, "none in 20 s");
	CHECK("LOC_PROT_ERR", wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 7, "status %d (%s)", wc.status,
	      ibv_wc_status_str(wc.status));
	CHECK("destroy_qp", ibv_destroy_qp(qp) == 0, "");

	/* Dereg of an MR a posted WR still uses: it goes at once; the WR can
	 * no longer reach the memory and completes with an error. */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, other, sizeof other, IBV_ACCESS_LOCAL_WRITE);
	qp = rc_qp(pd, cq, 4, 4);
	CHECK("create_qp", mr2 && qp && to_init(qp) == 0 && to_rts(qp, argv[2]) == 0, "");
	struct ibv_sge s2 = { .addr = (uintptr_t)other, .length = sizeof other, .lkey = mr2->lkey };
	struct ibv_send_wr w2 = { .wr_id = 9, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	CHECK("post_send", ibv_post_send(qp, &w2, &bad) == 0, "");
	CHECK("dereg_mr of an MR in use", ibv_dereg_mr(mr2) == 0, "");
	CHECK("the WR completes", wait_wc(cq, &wc) == 1, "none in 20 s");
	CHECK("with an error, not success", wc.wr_id == 9 && wc.status != IBV_WC_SUCCESS, "status %d",
	      wc.status);
	printf("dereg in use: %s\n", ibv_wc_status_str(wc.status));
	CHECK("destroy_qp", ibv_destroy_qp(qp) == 0, "");

	/* The ibv_wr_* path: only a QP created with send ops has one. */
	qp = rc_qp(pd, cq, 2, 2);
	CHECK("qp_to_qp_ex of a plain QP is NULL", qp && ibv_qp_to_qp_ex(qp) == NULL, "");
	CHECK("destroy_qp", ibv_destroy_qp(qp) == 0, "");
	struct ibv_qp_init_attr_ex ax = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_BIND_MW,
	};
	errno = 0;
	CHECK("create_qp_ex with a send op we lack is NULL/EOPNOTSUPP",
	      !ibv_create_qp_ex(ctx, &ax) && errno == EOPNOTSUPP, "errno %d", errno);
	ax.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *xq = ibv_create_qp_ex(ctx, &ax);
	CHECK("create_qp_ex with send ops", xq != NULL, "errno %d", errno);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(xq);
	CHECK("qp_to_qp_ex", qx != NULL && &qx->qp_base == xq, "");
	CHECK("INIT", to_init(xq) == 0, "");
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	CHECK("wr_complete in INIT is EINVAL", ibv_wr_complete(qx) == EINVAL, "");
	CHECK("RTS", to_rts(xq, argv[2]) == 0, "");
	ibv_wr_start(qx);
	for (int i = 0; i < 3; i++) {
		qx->wr_id = 10 + i;
		ibv_wr_rdma_write(qx, 0x1234, 0x1000);
		ibv_wr_set_inline_data(qx, buf, 8);
	}
	CHECK("wr_complete beyond the queue depth is ENOMEM", ibv_wr_complete(qx) == ENOMEM, "");
	ibv_wr_start(qx);
	ibv_wr_send(qx);
	ibv_wr_abort(qx);
	ibv_wr_start(qx);
	CHECK("wr_complete after an abort posts nothing", ibv_wr_complete(qx) == 0, "");
	CHECK("and nothing completes", ibv_poll_cq(cq, 1, &wc) == 0, "");
	CHECK("destroy_qp", ibv_destroy_qp(xq) == 0, "");

	/* Completion channels and the async fd are real descriptors. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *ecq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	CHECK("a channel and a CQ on it", ecq != NULL, "errno %d", errno);
	CHECK("req_notify_cq", ibv_req_notify_cq(ecq, 0) == 0, "");
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
	CHECK("poll on the channel: nothing yet", poll(&pf, 1, 0) == 0, "");
	int ep = epoll_create1(0);
	struct epoll_event ee = { .events = EPOLLIN }, got;
	CHECK("epoll_ctl ADD of the channel fd", epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ee) == 0, "errno %d",
	      errno);
	CHECK("epoll_wait: nothing yet", epoll_wait(ep, &got, 1, 0) == 0, "");
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_cq *gcq;
	void *gctx;
	errno = 0;
	CHECK("get_cq_event with O_NONBLOCK is EAGAIN", ibv_get_cq_event(ch, &gcq, &gctx) == -1 && errno == EAGAIN,
	      "errno %d", errno);
	fcntl(ch->fd, F_SETFL, fl);
	alarm_soon();
	errno = 0;
	CHECK("a blocked get_cq_event returns EINTR on a signal",
	      ibv_get_cq_event(ch, &gcq, &gctx) == -1 && errno == EINTR, "errno %d", errno);
	/* The QPs above died (QP_FATAL each, their QPs gone since): drain
	 * without blocking until EAGAIN, then block and be interrupted. */
	fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event aev;
	int drained = 0;
	errno = 0;
	while (ibv_get_async_event(ctx, &aev) == 0 && drained < 100) {
		ibv_ack_async_event(&aev);
		drained++;
	}
	CHECK("get_async_event with O_NONBLOCK ends in EAGAIN", errno == EAGAIN, "errno %d", errno);
	fcntl(ctx->async_fd, F_SETFL, fl);
	alarm_soon();
	errno = 0;
	CHECK("a blocked get_async_event returns EINTR on a signal",
	      ibv_get_async_event(ctx, &aev) == -1 && errno == EINTR, "errno %d", errno);
	close(ep);
	CHECK("destroy the CQ, then its channel", ibv_destroy_cq(ecq) == 0 && ibv_destroy_comp_channel(ch) == 0,
	      "");

	/* Shared receive queues. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 2, .max_sge = 1 } };
	struct ibv_srq_init_attr bad_sa = { .attr = { .max_wr = 0, .max_sge = 1 } };
	errno = 0;
	CHECK("create_srq with 0 WRs is NULL/EINVAL", !ibv_create_srq(pd, &bad_sa) && errno == EINVAL,
	      "errno %d", errno);
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK("create_srq", srq != NULL, "errno %d", errno);
	struct ibv_recv_wr *srbad = NULL;
	CHECK("post_srq_recv", ibv_post_srq_recv(srq, &rwr, &srbad) == 0, "");
	CHECK("post_srq_recv", ibv_post_srq_recv(srq, &rwr, &srbad) == 0, "");
	CHECK("post_srq_recv beyond depth is ENOMEM", ibv_post_srq_recv(srq, &rwr, &srbad) == ENOMEM &&
	      srbad == &rwr, "");
	struct ibv_srq_attr sq_attr = { .srq_limit = 3 };
	CHECK("a limit beyond the depth is EINVAL", ibv_modify_srq(srq, &sq_attr, IBV_SRQ_LIMIT) == EINVAL, "");
	sq_attr.srq_limit = 1;
	CHECK("modify_srq limit", ibv_modify_srq(srq, &sq_attr, IBV_SRQ_LIMIT) == 0, "");
	memset(&sq_attr, 0, sizeof sq_attr);
	CHECK("query_srq", ibv_query_srq(srq, &sq_attr) == 0 && sq_attr.max_wr == 2 && sq_attr.srq_limit == 1,
	      "max_wr %u limit %u", sq_attr.max_wr, sq_attr.srq_limit);
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *sqp = ibv_create_qp(pd, &qa);
	CHECK("create_qp on an SRQ", sqp != NULL && to_init(sqp) == 0, "errno %d", errno);
	CHECK("post_recv on a QP with an SRQ is EINVAL", ibv_post_recv(sqp, &rwr, &rbad) == EINVAL, "");
	CHECK("destroy_srq in use is EBUSY", ibv_destroy_srq(srq) == EBUSY, "");
	CHECK("destroy_qp", ibv_destroy_qp(sqp) == 0, "");
	CHECK("destroy_srq", ibv_destroy_srq(srq) == 0, "");
	CHECK("destroy_srq twice is EINVAL", ibv_destroy_srq(srq) == EINVAL, "");

	/* Closing a device with a live QP: EBUSY, and nothing changes: the QP
	 * keeps working, and once it is destroyed the device closes. Objects
	 * other than QPs do not keep it open (perftest's ib_send_bw client
	 * closes with its receive CQ left): they stay usable until destroyed.
	 * rdma-core returns 0 in both cases: rxe's free_context closes the
	 * command fd (the kernel destroys the objects) and frees the context,
	 * which the program's objects still point to, so a later call on one
	 * reads freed memory. */
	qp = rc_qp(pd, cq, 2, 2);
	CHECK("create_qp", qp != NULL, "errno %d", errno);
	errno = 0;
	CHECK("close_device with a live QP is EBUSY", ibv_close_device(ctx) == EBUSY && errno == EBUSY, "errno %d",
	      errno);
	CHECK("modify_qp after it", to_init(qp) == 0 && qp->state == IBV_QPS_INIT, "state %d", qp->state);
	struct ibv_device_attr da;
	CHECK("query_device after it", ibv_query_device(ctx, &da) == 0, "");
	CHECK("destroy_qp after it", ibv_destroy_qp(qp) == 0, "");

	CHECK("dereg_mr", ibv_dereg_mr(mr) == 0, "");
	CHECK("dereg_mr twice is EINVAL", ibv_dereg_mr(mr) == EINVAL, "");
	CHECK("dealloc_pd", ibv_dealloc_pd(pd) == 0, "");
	CHECK("close_device with only a CQ left", ibv_close_device(ctx) == 0, "");
	CHECK("destroy_cq after it", ibv_destroy_cq(cq) == 0, "");
	CHECK("close_device twice is EINVAL", ibv_close_device(ctx) == EINVAL, "");
	ibv_free_device_list(list);
	printf("all ok\n");
	return failed;
}
