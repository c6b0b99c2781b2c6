! The same gradient in Fortran, through module vlcc; then it checks the C
! program's gradient out of the history and compares.
!
! argument 1: the history (the gradient is committed on branch "fortran").
program adjoint
   use, intrinsic :: iso_c_binding, only: c_ptr
   use, intrinsic :: iso_fortran_env, only: real64, int64
   use vlcc
   implicit none
   integer, parameter :: nx = 64, n = 1000
   real(real64), parameter :: a = 0.25_real64, dt = 0.01_real64
   real(real64), target :: u(nx), u0(nx), lam(nx), from_c(nx), u0_c(nx)
   type(c_ptr) :: run, h
   type(vlcc_action) :: act
   character(len=VLCC_VERSION_SIZE) :: version
   character(len=4096) :: path
   integer(int64) :: i, forward_steps
   integer :: k

   path = 'history'
   if (command_argument_count() > 0) call get_command_argument(1, path)
   do k = 0, nx - 1
      u0(k + 1) = real(k*(nx - 1 - k), real64)/(nx*nx/4)
   end do
   u = u0
   forward_steps = 0

   call check(vlcc_run_open(run, '{"schedule": {"kind": "revolve", "steps": 1000, "snapshots": 8}}'))
   call check(vlcc_run_protect(run, 'u', u))      ! u holds u_0
   do
      call check(vlcc_run_next(run, act))
      select case (act%kind)
      case (VLCC_ADVANCE)                         ! u holds u_from: advance it to u_to
         do i = act%from, act%to - 1
            call step(u)
         end do
         forward_steps = forward_steps + act%to - act%from
      case (VLCC_TURN)                            ! u holds u_N
         lam = u
      case (VLCC_REVERSE)                         ! u holds u_to
         call adjoint_step(u, lam)
      case (VLCC_DONE)
         exit
      end select
   end do
   call check(vlcc_run_close(run))
   print '(a, i0, a, i0, a)', 'Fortran: ', n, ' adjoint steps, ', forward_steps, &
      ' forward steps, 8 states of memory'

   call check(vlcc_history_open(h, trim(path), 'a'))
   call check(vlcc_history_protect(h, 'u0', u0))
   call check(vlcc_history_protect(h, 'gradient', lam))
   call check(vlcc_history_commit(h, 'fortran', 'the gradient, from Fortran', version))
   print '(a, a, a)', 'Fortran: committed version ', trim(version), ' on branch fortran'
   call check(vlcc_history_close(h))

   ! the C program's version, into other arrays
   call check(vlcc_history_open(h, trim(path), 'r'))
   call check(vlcc_history_protect(h, 'u0', u0_c))
   call check(vlcc_history_protect(h, 'gradient', from_c))
   call check(vlcc_history_checkout(h, 'c'))
   call check(vlcc_history_close(h))
   print '(a, es9.2)', 'Fortran: largest difference to the gradient from C: ', &
      maxval(abs(lam - from_c))

contains

   subroutine diffuse(v, out)
      real(real64), intent(in) :: v(nx)
      real(real64), intent(out) :: out(nx)
      real(real64) :: left, right
      integer :: j
      do j = 1, nx
         left = 0; right = 0
         if (j > 1) left = v(j - 1)
         if (j < nx) right = v(j + 1)
         out(j) = v(j) + a*(left - 2*v(j) + right)
      end do
   end subroutine diffuse

   subroutine step(v)
      real(real64), intent(inout) :: v(nx)
      real(real64) :: next(nx)
      call diffuse(v, next)
      v = next - dt*v*v*v
   end subroutine step

   subroutine adjoint_step(v, l)
      real(real64), intent(in) :: v(nx)
      real(real64), intent(inout) :: l(nx)
      real(real64) :: next(nx)
      call diffuse(l, next)
      l = next - 3*dt*v*v*l
   end subroutine adjoint_step

   subroutine check(ierr)
      integer, intent(in) :: ierr
      if (ierr /= VLCC_OK) then
         print '(a, i0, a, a)', 'vlcc error ', ierr, ': ', vlcc_last_error()
         error stop 1
      end if
   end subroutine check
end program adjoint
