! The gradient of a 1-D reaction-diffusion solver, checkpointed by vlcc-adjoint from Fortran.
!
!   u_{i+1} = u_i + A L u_i - DT u_i^3      (L: the second difference, u = 0 outside)
!   J(u_0)  = |u_n|^2 / 2
!
! The adjoint, written by hand: lambda_n = u_n, and
!   lambda_i = lambda_{i+1} + A L lambda_{i+1} - 3 DT u_i^2 lambda_{i+1}
! (L is symmetric), so lambda_0 = dJ/du_0.  Every adjoint step needs the
! state u_i: that is what the schedule keeps or recomputes.
!
! The program computes the gradient three ways and checks that they agree
! bit for bit: (1) every state kept in an array (no vlcc), (2) Revolve(N, 10)
! through vlcc, (3) a two-level Multistage through vlcc with a zarr store on
! disk; then a Taylor test of the Revolve gradient.
!
! Build and run (the flags carry rpaths: no environment variables needed):
!   gfortran heat_adjoint.f90 $(python -m vlcc_adjoint.capi --fflags) -o heat_adjoint
!   ./heat_adjoint [directory for the disk level, default .]
module heat
   use, intrinsic :: iso_fortran_env, only: real64
   implicit none
   integer, parameter :: nx = 200, n = 500
   real(real64), parameter :: a = 0.25_real64, dt = 0.01_real64

contains

   ! out = v + A L v (L with u = 0 outside the grid).
   subroutine diffuse(v, out)
      real(real64), intent(in) :: v(nx)
      real(real64), intent(out) :: out(nx)
      real(real64) :: left, right
      integer :: k
      do k = 1, nx
         left = 0; right = 0
         if (k > 1) left = v(k - 1)
         if (k < nx) right = v(k + 1)
         out(k) = v(k) + a*(left - 2*v(k) + right)
      end do
   end subroutine diffuse

   subroutine step(u)
      real(real64), intent(inout) :: u(nx)
      real(real64) :: next(nx)
      call diffuse(u, next)
      u = next - dt*u*u*u
   end subroutine step

   ! lam <- (I + A L - 3 DT diag(u^2)) lam, with u = u_i.
   subroutine adjoint_step(u, lam)
      real(real64), intent(in) :: u(nx)
      real(real64), intent(inout) :: lam(nx)
      real(real64) :: next(nx)
      call diffuse(lam, next)
      lam = next - 3*dt*u*u*lam
   end subroutine adjoint_step

   real(real64) function objective(u)
      real(real64), intent(in) :: u(nx)
      integer :: k
      objective = 0
      do k = 1, nx
         objective = objective + 0.5_real64*u(k)*u(k)
      end do
   end function objective

   real(real64) function forward(u0)
      real(real64), intent(in) :: u0(nx)
      real(real64) :: u(nx)
      integer :: i
      u = u0
      do i = 1, n
         call step(u)
      end do
      forward = objective(u)
   end function forward

   subroutine gradient_store_all(u0, grad)
      real(real64), intent(in) :: u0(nx)
      real(real64), intent(out) :: grad(nx)
      real(real64), allocatable :: states(:, :)
      integer :: i
      allocate (states(nx, 0:n))
      states(:, 0) = u0
      do i = 0, n - 1
         states(:, i + 1) = states(:, i)
         call step(states(:, i + 1))
      end do
      grad = states(:, n)
      do i = n - 1, 0, -1
         call adjoint_step(states(:, i), grad)
      end do
   end subroutine gradient_store_all

   subroutine gradient_vlcc(config, u0, grad)
      use, intrinsic :: iso_c_binding, only: c_ptr
      use vlcc
      character(len=*), intent(in) :: config
      real(real64), intent(in) :: u0(nx)
      real(real64), intent(out) :: grad(nx)
      real(real64), target :: u(nx)
      real(real64) :: lam(nx)
      type(c_ptr) :: run
      type(vlcc_action) :: action
      integer(8) :: i
      u = u0
      call check(vlcc_run_open(run, config), 'vlcc_run_open')
      call check(vlcc_run_protect(run, 'u', u), 'vlcc_run_protect')
      do
         call check(vlcc_run_next(run, action), 'vlcc_run_next')
         select case (action%kind)
         case (VLCC_ADVANCE)          ! u holds u_from
            do i = action%from, action%to - 1
               call step(u)
            end do
         case (VLCC_TURN)             ! u holds u_n
            lam = u
         case (VLCC_REVERSE)          ! u holds u_to
            call adjoint_step(u, lam)
         case (VLCC_DONE)
            exit
         end select
      end do
      call check(vlcc_run_close(run), 'vlcc_run_close')
      grad = lam
   end subroutine gradient_vlcc

   subroutine check(ierr, what)
      use vlcc, only: vlcc_last_error
      integer, intent(in) :: ierr
      character(len=*), intent(in) :: what
      if (ierr /= 0) then
         print '(a, " failed (", i0, "): ", a)', what, ierr, vlcc_last_error()
         error stop 1
      end if
   end subroutine check
end module heat

program heat_adjoint
   use heat
   implicit none
   real(real64) :: u0(nx), reference(nx), revolve(nx), multistage(nx), v(nx), shifted(nx)
   real(real64) :: j0, dj, h, r, previous, order, worst
   character(len=4096) :: dir
   character(len=16) :: steps
   logical :: same_revolve, same_multistage
   integer :: k, e

   dir = '.'
   if (command_argument_count() > 0) call get_command_argument(1, dir)
   do k = 1, nx
      u0(k) = sin(3.14159265358979_real64*k/(nx + 1)) + 0.5_real64*sin(7.0_real64*(k - 1)/nx)
   end do
   write (steps, '(i0)') n

   call gradient_store_all(u0, reference)
   call gradient_vlcc('{"schedule": {"kind": "revolve", "steps": '//trim(steps)// &
                      ', "snapshots": 10}}', u0, revolve)
   call gradient_vlcc('{"schedule": {"kind": "multistage", "steps": '//trim(steps)// &
                      ', "levels": [{"slots": 3}, {"slots": 12, "write_cost": 2, "read_cost": 2}]}, '// &
                      '"store": {"tiers": [{"kind": "memory"}, {"kind": "zarr", "path": "'// &
                      trim(dir)//'/heat_checkpoints_f.zarr", "mode": "w"}]}}', u0, multistage)

   ! Bitwise: compare the bits, not the values.
   same_revolve = all(transfer(revolve, 0_8, nx) == transfer(reference, 0_8, nx))
   same_multistage = all(transfer(multistage, 0_8, nx) == transfer(reference, 0_8, nx))
   print '(a, i0, a, a)', 'Revolve(', n, ', 10) gradient bitwise equal to store-all: ', &
      merge('yes', 'NO ', same_revolve)
   print '(a, a)', 'Multistage(memory 3 + zarr disk 12) gradient bitwise equal to store-all: ', &
      merge('yes', 'NO ', same_multistage)

   ! Taylor test: r(h) = |J(u0 + h v) - J(u0) - h <g, v>| = O(h^2).
   do k = 1, nx
      v(k) = cos(5.0_real64*(k - 1)/nx)
   end do
   j0 = forward(u0)
   dj = dot_product(revolve, v)
   print '(a)', 'Taylor test (remainder must shrink as h^2: order 2)'
   worst = 3
   previous = 0
   do e = 0, 4
      h = 1e-2_real64/2**e
      shifted = u0 + h*v
      r = abs(forward(shifted) - j0 - h*dj)
      if (e > 0) then
         order = log(previous/r)/log(2.0_real64)
         worst = min(worst, order)
         print '(a, f7.5, a, es10.3, a, f6.3)', '  h = ', h, '  remainder = ', r, '  order = ', order
      else
         print '(a, f7.5, a, es10.3)', '  h = ', h, '  remainder = ', r
      end if
      previous = r
   end do
   print '(a, a)', 'Taylor test passed: ', merge('yes', 'NO ', worst > 1.9_real64)
   if (.not. (same_revolve .and. same_multistage .and. worst > 1.9_real64)) error stop 1
end program heat_adjoint
